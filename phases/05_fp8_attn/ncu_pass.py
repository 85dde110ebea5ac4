"""One forward each of SDPA cuDNN, our bf16 forward (``triton``) and the FP8 forward
(``triton-fp8``: ``fp8_attention_forward``, its K/V quantisation launch included), for Nsight Compute.

    ncu --clock-control none --profile-from-start off --nvtx --section SpeedOfLight \\
        --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \\
        --section WarpStateStats --section SchedulerStats -o /tmp/fp8 python -m phases.05_fp8_attn.ncu_pass --shape mid
    python -m common.ncu /tmp/fp8.ncu-rep --phase 05_fp8_attn --shape mid

The rows land in reports/data/05_fp8_attn/ncu/ and the report's "Where the time goes" section.
"""

from functools import partial

from common.attention_bench import profile_against_cudnn
from tritonlab.attention import attention_forward, fp8_attention_forward

from .report import FP8, OURS_BF16


def main(argv=None) -> None:
    profile_against_cudnn(
        "python -m phases.05_fp8_attn.ncu_pass",
        {OURS_BF16["fwd"]: attention_forward, FP8: partial(fp8_attention_forward, force_fp8=True)},
        backward=False,
        argv=argv,
    )


if __name__ == "__main__":
    main()
