"""Label smoothing's logit sum in sweep 2 (per lane, beside the gradient: ``smoothing_sum_sweep2``)
against sweep 1 (beside the exponentials, in the block reductions), at the short rows' settings
(two programs an SM): the plain loss, smoothing and every option on, forward + backward, bf16, GPU time
only, as ``ce_short_rows.py`` times it.

    PYTHONPATH=. python3 reports/data/kernel_suite/diagnostics/ce_smoothing_sweep.py [ROWSxVOCAB ...]
"""

import dataclasses
import sys

from tritonlab.ops.cross_entropy import SHORT_ROW_SETTINGS

sys.path.insert(0, "reports/data/kernel_suite/diagnostics")
from ce_settings_small_vocab import OPTIONS  # noqa: E402
from ce_short_rows import compare, shapes_from_argv  # noqa: E402

SETTINGS = {
    "sweep2": SHORT_ROW_SETTINGS,
    "sweep1": dataclasses.replace(SHORT_ROW_SETTINGS, smoothing_sum_sweep2=False),
}
SHAPES = [(4096, 32000), (16384, 32000), (8192, 50257)]

if __name__ == "__main__":
    compare(SETTINGS, shapes_from_argv(SHAPES), {k: OPTIONS[k] for k in ("plain", "smoothing", "all")})
