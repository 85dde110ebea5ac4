"""One causal bf16 forward + backward each of FlashAttentionTriton and SDPA cuDNN at the goal
shape (16, 16384, 64), for Nsight Compute.

    ncu --clock-control none --profile-from-start off --nvtx --section SpeedOfLight \\
        --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \\
        --section WarpStateStats --section SchedulerStats -o /tmp/flash2 python -m phases.flash2.ncu_pass
    python -m common.ncu /tmp/flash2.ncu-rep --phase flash2 --shape "B=16 N=16384 D=64"

The rows land in reports/data/flash2/ncu/ and the report's "Where the time goes" table.
"""

import torch

from common import DEVICE, ON_GPU
from common.ncu import profile_once

from .bench import GOAL_SHAPE, attention_impls


def main() -> None:
    if not ON_GPU:
        raise SystemExit("ncu_pass: needs a CUDA GPU (and ncu around it)")
    batch, n, head_dim = GOAL_SHAPE
    g = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v, do = (
        torch.randn(batch, n, head_dim, device=DEVICE, dtype=torch.bfloat16, generator=g) for _ in range(4)
    )
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    impls = attention_impls(torch.bfloat16, n, causal=True)

    def forward_backward(fn):
        return torch.autograd.grad(fn(q, k, v), (q, k, v), do)

    profile_once({name: (lambda fn=impls[name]: forward_backward(fn)) for name in ("sdpa-cudnn", "triton")})


if __name__ == "__main__":
    main()
