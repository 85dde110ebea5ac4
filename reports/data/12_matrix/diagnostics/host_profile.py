"""Where the host's time goes in one compiled TransformerNP training step with our kernels (the
small shape, where that step waits on the host): the step's wall time over 10 steps, then cProfile
over 5 more, by internal and by cumulative time.

    PYTHONPATH=. python3 reports/data/12_matrix/diagnostics/host_profile.py [small] [variant]
"""

import cProfile
import pstats
import sys
import time

import torch

from common.timing import top_functions
from tritonlab import attention as attn
from tritonlab.gmm import gmm_nll
from tritonlab.grouped_gemm import gmm_heads
from tritonlab.mlp import fused_mlp
from tritonlab.models import Components, TNPConfig, build, sample_tasks
from tritonlab.models.shapes import SHAPES
from tritonlab.models.training import train_step


def wall_ms(fn, steps: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / steps


def main():
    shape = SHAPES[sys.argv[1] if len(sys.argv) > 1 else "small"]
    cfg = TNPConfig()
    components = Components(attention=attn.fused_attention, mlp=fused_mlp, heads=gmm_heads, loss=gmm_nll)
    gen = torch.Generator(device="cuda").manual_seed(0)
    tasks = sample_tasks(
        shape.batch, shape.m_context, shape.n_target, x_dim=cfg.x_dim, device="cuda", generator=gen
    )
    model, optimizer = build(cfg, components, 0, "cuda")
    loss_fn = torch.compile(model.loss, dynamic=False, fullgraph=True)

    def step():
        train_step(model, loss_fn, optimizer, tasks, torch.bfloat16)

    for _ in range(3):
        step()
    print(f"# {torch.cuda.get_device_name()}, {shape.label()}, compile+custom-bf16-fused")
    print(f"step wall time {wall_ms(step, 10):.2f} ms (10 steps)")
    profiler = cProfile.Profile()
    profiler.enable()
    wall = wall_ms(step, 5)
    profiler.disable()
    print(f"under cProfile {wall:.2f} ms a step (5 steps)")
    for order in ("tottime", "cumulative"):
        print(top_functions(pstats.Stats(profiler), order, 40) + "\n")


if __name__ == "__main__":
    main()
