"""One forward + backward each of SDPA cuDNN, phase 03 and phase 04, for Nsight Compute.

    ncu --clock-control none --profile-from-start off --nvtx --section SpeedOfLight \\
        --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \\
        --section WarpStateStats --section SchedulerStats -o /tmp/attn python -m phases.04_fused_attn.ncu_pass --shape mid
    python -m common.ncu /tmp/attn.ncu-rep --phase 04_fused_attn --shape mid

The rows land in reports/data/04_fused_attn/ncu/ and the report's "Where the time goes" table.
"""

import importlib
from functools import partial

from common.ncu import pass_shape, profile_once

from .fused import attention

benchmark = importlib.import_module("phases.02_attn_fwd.benchmark")
two_pass = importlib.import_module("phases.03_attn_bwd")


def main(argv=None) -> None:
    shape = pass_shape("python -m phases.04_fused_attn.ncu_pass", argv)
    q, k, v, do = benchmark.make_inputs(benchmark.tnp_case(shape), benchmark.DTYPE, grad=True)
    impls = {
        "sdpa-cudnn": benchmark.sdpa_variants()["sdpa-cudnn"],
        "triton-2pass": two_pass.attention,
        "triton-fused": attention,
    }
    profile_once(
        {name: partial(benchmark.run_case, fn, q, k, v, do, backward=True) for name, fn in impls.items()}
    )


if __name__ == "__main__":
    main()
