"""Every option on at short rows (32 000 and 50 257 bf16 logits): the short rows' settings against
variants of them -- smaller blocks, four programs an SM, the running max instead of the softcap's
fixed max -- the plain loss beside each, GPU time from CUDA graphs, alternating
(``ce_short_rows.compare``). Looks for settings under which every option on costs <= 1.05x the
plain loss without slowing the plain loss.

    PYTHONPATH=. python3 reports/data/kernel_suite/diagnostics/ce_short_options_settings.py
"""

import dataclasses
import sys

from tritonlab.ops.cross_entropy import SHORT_ROW_SETTINGS

sys.path.insert(0, "reports/data/kernel_suite/diagnostics")
from ce_settings_small_vocab import OPTIONS  # noqa: E402
from ce_short_rows import compare  # noqa: E402

VARIANTS = {
    "16KB-16w-2/SM": dict(block_bytes=16384),
    "16KB-8w-4/SM": dict(block_bytes=16384, num_warps=8, programs_per_sm=4.0),
    "32KB-8w-4/SM": dict(num_warps=8, programs_per_sm=4.0),
    "running-max": dict(fixed_max=False),
    "sweep2-sum": dict(smoothing_sum_sweep2=True),
}

if __name__ == "__main__":
    options = {name: OPTIONS[name] for name in ("plain", "all", "softcap")}
    for name, change in VARIANTS.items():
        compare(
            {"short": SHORT_ROW_SETTINGS, name: dataclasses.replace(SHORT_ROW_SETTINGS, **change)},
            [(4096, 32000), (8192, 50257)],
            options,
        )
