"""One forward + backward each of the one-kernel forwards, the two-kernel forward and cuBLAS on the
padded weights, for Nsight Compute (``common/ncu.py``).

    ncu --clock-control none --profile-from-start off --nvtx --section SpeedOfLight \\
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \\
        --section LaunchStats --section WarpStateStats --section SchedulerStats \\
        -o /tmp/mlp python -m phases.06_fused_mlp.ncu_pass --shape mid
    python -m common.ncu /tmp/mlp.ncu-rep --phase 06_fused_mlp --shape mid

The rows land in reports/data/06_fused_mlp/ncu/ and the report's "Where the time goes" table.
torch.compile is left out: Inductor decides whether to pad the misaligned GEMMs by timing both
while it compiles, and under ncu those timings are distorted, so it compiled the unpadded GEMMs
(2.8 ms of kernels against 1.26 ms in the benchmark).
"""

import torch

from common.ncu import pass_shape, profile_once
from tritonlab.tuning import ConfigRecord

from .bench import mlp_inputs, variant_fn


def main(argv=None) -> None:
    shape = pass_shape("python -m phases.06_fused_mlp.ncu_pass", argv)
    (x, w1, w2), grad_out = mlp_inputs(shape.tokens, torch.bfloat16)

    def forward_backward(fn):
        return torch.autograd.grad(fn(x, w1, w2), (x, w1, w2), grad_out)

    names = ("fused-recompute", "fused-registers", "gemm-silu+cublas", "padded-cublas")
    fns = {name: variant_fn(name, ConfigRecord()) for name in names}
    profile_once({name: (lambda fn=fns[name]: forward_backward(fn)) for name in names})


if __name__ == "__main__":
    main()
