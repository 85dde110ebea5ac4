"""One forward + backward each of SDPA cuDNN, the two-pass and the fused backward, for Nsight Compute.

    ncu --clock-control none --profile-from-start off --nvtx --section SpeedOfLight \\
        --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \\
        --section WarpStateStats --section SchedulerStats -o /tmp/attn python -m phases.04_fused_attn.ncu_pass --shape mid
    python -m common.ncu /tmp/attn.ncu-rep --phase 04_fused_attn --shape mid

The rows land in reports/data/04_fused_attn/ncu/ and the report's "Where the time goes" section.
"""

from common.attention_bench import profile_against_cudnn
from tritonlab.attention import attention, fused_attention


def main(argv=None) -> None:
    ours = {"triton-2pass": attention, "triton-fused": fused_attention}
    profile_against_cudnn("python -m phases.04_fused_attn.ncu_pass", ours, backward=True, argv=argv)


if __name__ == "__main__":
    main()
