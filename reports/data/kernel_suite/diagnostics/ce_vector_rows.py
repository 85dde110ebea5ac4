"""Rows that are not whole 16-byte vectors (a 50 257-word vocabulary in bf16), swept from the 16-byte
boundary before each row (``vector_rows``, the kernel's ``ALIGN``: 16-byte loads and stores over
the row's whole vectors, its few edge columns apart) against element-wise sweeps (2-byte accesses),
forward + backward, bf16, GPU time from CUDA graphs, alternating (``ce_short_rows.compare``). Rows of
whole vectors (32 000) run the same kernel either way: a control.

    PYTHONPATH=. python3 reports/data/kernel_suite/diagnostics/ce_vector_rows.py
"""

import dataclasses
import sys

from tritonlab.ops.cross_entropy import DEFAULT_SETTINGS, SHORT_ROW_SETTINGS

sys.path.insert(0, "reports/data/kernel_suite/diagnostics")
from ce_short_rows import compare  # noqa: E402

if __name__ == "__main__":
    for settings, shapes in (
        (SHORT_ROW_SETTINGS, [(8192, 50257), (4096, 50257), (4096, 32000)]),
        (DEFAULT_SETTINGS, [(4096, 100277)]),
    ):
        compare(
            {"element-wise": dataclasses.replace(settings, vector_rows=False), "vectors": settings}, shapes
        )
