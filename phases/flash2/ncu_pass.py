"""One causal bf16 forward + backward each of SDPA cuDNN and ``triton`` (FlashAttentionTriton as a
user calls it: the Gluon kernels on Hopper), at the goal shape (16, 16384, 64) unless ``--shape B N D``
names another, for Nsight Compute.

    ncu --clock-control none --profile-from-start off --nvtx --section SpeedOfLight \\
        --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \\
        --section WarpStateStats --section SchedulerStats -o /tmp/flash2 python -m phases.flash2.ncu_pass
    python -m common.ncu /tmp/flash2.ncu-rep --phase flash2 --shape "B=16 N=16384 D=64"

The rows land in reports/data/flash2/ncu/ and the report's "Where the time goes" section.
"""

import torch

from common.ncu import parse_pass_shape, profile_once

from .bench import GOAL_SHAPE, attention_impls, random_qkv


def main(argv=None) -> None:
    batch, n, head_dim = parse_pass_shape(
        "python -m phases.flash2.ncu_pass", argv, type=int, nargs=3, default=GOAL_SHAPE, metavar=("B", "N", "D"),
        help=f"batch, sequence length, head dim (default {' '.join(map(str, GOAL_SHAPE))}, the goal shape)",
    )  # fmt: skip
    q, k, v = random_qkv(batch, n, head_dim, torch.bfloat16)
    do = torch.randn_like(q)
    impls = attention_impls(torch.bfloat16, n, causal=True)

    def forward_backward(fn):
        return torch.autograd.grad(fn(q, k, v), (q, k, v), do)

    profile_once({name: (lambda fn=impls[name]: forward_backward(fn)) for name in ("sdpa-cudnn", "triton")})


if __name__ == "__main__":
    main()
