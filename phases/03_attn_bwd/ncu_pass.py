"""One forward + backward each of SDPA cuDNN and ``triton-2pass`` (``attention``: phase 02's forward,
the two-pass backward), for Nsight Compute.

    ncu --clock-control none --profile-from-start off --nvtx --section SpeedOfLight \\
        --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \\
        --section WarpStateStats --section SchedulerStats -o /tmp/bwd python -m phases.03_attn_bwd.ncu_pass --shape mid
    python -m common.ncu /tmp/bwd.ncu-rep --phase 03_attn_bwd --shape mid

The rows land in reports/data/03_attn_bwd/ncu/ and the report's "Where the time goes" section.
"""

from common.attention_bench import profile_against_cudnn
from tritonlab.attention import attention


def main(argv=None) -> None:
    profile_against_cudnn(
        "python -m phases.03_attn_bwd.ncu_pass", {"triton-2pass": attention}, backward=True, argv=argv
    )


if __name__ == "__main__":
    main()
