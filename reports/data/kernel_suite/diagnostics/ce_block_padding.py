"""Rows that end early in their last block: 50 257 bf16 logits are 3.07 blocks of the short rows'
32 KB (the fourth block's logits are 7% real, but its exponentials run for all of it: 30% more
work than the row), 100 277 are 3.06 of the long rows' 64 KB. The settings' block against halved and
quartered ones at those sizes (same warps and programs an SM), the plain loss, the softcap and
every option on, GPU time from CUDA graphs, alternating (``ce_short_rows.compare``).

    PYTHONPATH=. python3 reports/data/kernel_suite/diagnostics/ce_block_padding.py
"""

import dataclasses
import sys

from tritonlab.ops.cross_entropy import DEFAULT_SETTINGS, SHORT_ROW_SETTINGS

sys.path.insert(0, "reports/data/kernel_suite/diagnostics")
from ce_settings_small_vocab import OPTIONS  # noqa: E402
from ce_short_rows import compare  # noqa: E402

if __name__ == "__main__":
    options = {name: OPTIONS[name] for name in ("plain", "softcap", "all")}
    for settings, shapes in ((SHORT_ROW_SETTINGS, [(8192, 50257)]), (DEFAULT_SETTINGS, [(4096, 100277)])):
        for divisor in (2, 4):
            smaller = dataclasses.replace(settings, block_bytes=settings.block_bytes // divisor)
            compare(
                {f"{settings.block_bytes // 1024}KB": settings, f"{smaller.block_bytes // 1024}KB": smaller},
                shapes,
                options,
            )
