"""One forward each of SDPA cuDNN and ``triton`` (``attention_forward`` as a user calls it: the Gluon
kernel on Hopper from Lk = 1 000 on), for Nsight Compute.

    ncu --clock-control none --profile-from-start off --nvtx --section SpeedOfLight \\
        --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \\
        --section WarpStateStats --section SchedulerStats -o /tmp/fwd python -m phases.02_attn_fwd.ncu_pass --shape mid
    python -m common.ncu /tmp/fwd.ncu-rep --phase 02_attn_fwd --shape mid

The rows land in reports/data/02_attn_fwd/ncu/ and the report's "Where the time goes" section.
"""

from common.attention_bench import profile_against_cudnn
from tritonlab.attention import attention_forward


def main(argv=None) -> None:
    profile_against_cudnn(
        "python -m phases.02_attn_fwd.ncu_pass", {"triton": attention_forward}, backward=False, argv=argv
    )


if __name__ == "__main__":
    main()
