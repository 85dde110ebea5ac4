"""One forward + backward each of SDPA cuDNN, the two-pass and the fused backward, for Nsight Compute.

    ncu --clock-control none --profile-from-start off --nvtx --section SpeedOfLight \\
        --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \\
        --section WarpStateStats --section SchedulerStats -o /tmp/attn python -m phases.04_fused_attn.ncu_pass --shape mid
    python -m common.ncu /tmp/attn.ncu-rep --phase 04_fused_attn --shape mid

The rows land in reports/data/04_fused_attn/ncu/ and the report's "Where the time goes" table.
"""

from functools import partial

from common.attention_bench import DEFAULT_DTYPE, make_inputs, run_case, sdpa_variants, tnp_case
from common.ncu import pass_shape, profile_once
from tritonlab.attention import attention, fused_attention
from tritonlab.testing import DTYPES


def main(argv=None) -> None:
    shape = pass_shape("python -m phases.04_fused_attn.ncu_pass", argv)
    q, k, v, do = make_inputs(tnp_case(shape.name), DTYPES[DEFAULT_DTYPE], grad=True)
    impls = {
        "sdpa-cudnn": sdpa_variants()["sdpa-cudnn"],
        "triton-2pass": attention,
        "triton-fused": fused_attention,
    }
    profile_once({name: partial(run_case, fn, q, k, v, do, backward=True) for name, fn in impls.items()})


if __name__ == "__main__":
    main()
