"""Where one TransformerNP training step's GPU time goes, per variant: torch.profiler over timed
steps after warm-up. Prints, per variant, the wall time a step (CUDA events, over as many steps
without the profiler just before and under it), the GPU's busy time
(the union of kernel intervals) and its kernel time by family, then the top kernels, the GPU's
waits between kernels by size, and the largest (where the host fell behind) by the kernels around
them.

    PYTHONPATH=. python3 reports/data/12_matrix/diagnostics/step_profile.py small compile+sdpa-flash ...

Variants as phase 12 names them (sdpa-<backend>, custom-bf16-<attention>, with a compile+ prefix).
"""

import functools
import sys
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from common.step import summarize_kernels
from common.timing import cuda_kernel_events
from tritonlab import attention as attn
from tritonlab.gmm import gmm_nll
from tritonlab.grouped_gemm import gmm_heads
from tritonlab.mlp import fused_mlp, pad_hidden, padded_cublas_mlp
from tritonlab.models import Components, TNPConfig, build, gmm_heads_loop, sample_tasks, sdpa_attention
from tritonlab.models.shapes import SHAPES
from tritonlab.models.training import train_step

WARMUP, STEPS = 3, 3


def padded_heads(z, w1, w2):
    """The compiled baseline's head loop on weights with d_head_hidden padded to a multiple of 16."""
    return gmm_heads_loop(z, *pad_hidden(w1, w2))


def components(variant: str) -> Components:
    """Phase 12's variants; a custom one may end in ``:padmlp`` (the MLP as cuBLAS GEMMs on padded
    weights, phase 06's padded-cublas), ``:padheads`` (the head loop on padded weights),
    ``:savepreact`` (our heads keeping their pre-activation) and ``:kv`` (the fused attention over the
    packed K/V projection, ``fused_attention_kv``). Phase 12's ``custom-bf16-padded`` is
    ``custom-bf16-fused:padmlp:savepreact:kv``."""
    base, *options = variant.removeprefix("compile+").split(":")
    if base.startswith("sdpa-"):
        return Components(attention=sdpa_attention(base.removeprefix("sdpa-")))
    kind = base.rsplit("-", 1)[-1]
    fn = {"separate": attn.attention, "fused": attn.fused_attention, "mixed": sdpa_attention("cudnn")}[kind]
    mlp = padded_cublas_mlp if "padmlp" in options else fused_mlp
    heads = functools.partial(gmm_heads, save_preactivation=True) if "savepreact" in options else gmm_heads
    heads = padded_heads if "padheads" in options else heads
    packed = attn.fused_attention_kv if "kv" in options and kind == "fused" else None
    return Components(attention=fn, attention_kv=packed, mlp=mlp, heads=heads, loss=gmm_nll)


def idle_gaps(kernels, least_us: float = 5.0) -> list:
    """The GPU's idle intervals of at least ``least_us`` between kernels, summed by the pair of
    kernel names around them: [((before, after), (total µs, count))], the largest total first."""
    gaps = defaultdict(lambda: [0.0, 0])
    reach, last = None, None
    for e in sorted(kernels, key=lambda e: e.time_range.start):
        if reach is not None and e.time_range.start - reach >= least_us:
            gap = gaps[(last, e.name)]
            gap[0] += e.time_range.start - reach
            gap[1] += 1
        if reach is None or e.time_range.end > reach:
            reach, last = e.time_range.end, e.name
    return sorted(((pair, tuple(v)) for pair, v in gaps.items()), key=lambda kv: -kv[1][0])


def idle_by_size(kernels, bounds_us=(1.0, 2.0, 5.0, 20.0, 100.0)) -> list:
    """Every idle interval between the first kernel's start and the last one's end, in size classes:
    [(upper bound µs or inf, total µs, count)] -- the short gaps between back-to-back launches
    that ``idle_gaps`` leaves out add up too."""
    classes = [[bound, 0.0, 0] for bound in (*bounds_us, float("inf"))]
    reach = None
    for e in sorted(kernels, key=lambda e: e.time_range.start):
        if reach is not None and e.time_range.start > reach:
            gap = e.time_range.start - reach
            cls = next(c for c in classes if gap < c[0])
            cls[1] += gap
            cls[2] += 1
        if reach is None or e.time_range.end > reach:
            reach = e.time_range.end
    return [tuple(c) for c in classes]


def step_ms(step) -> float:
    """The wall time a step of ``STEPS`` calls of ``step`` back to back (CUDA events)."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(STEPS):
        step()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / STEPS


def profile_variant(shape, variant: str) -> None:
    cfg = TNPConfig()
    gen = torch.Generator(device="cuda").manual_seed(0)
    tasks = sample_tasks(
        shape.batch, shape.m_context, shape.n_target, x_dim=cfg.x_dim, device="cuda", generator=gen
    )
    model, optimizer = build(cfg, components(variant), 0, "cuda")
    loss_fn = model.loss
    if variant.startswith("compile+"):
        torch._dynamo.reset()
        loss_fn = torch.compile(model.loss, dynamic=False, fullgraph="custom" in variant)
    for _ in range(WARMUP):
        train_step(model, loss_fn, optimizer, tasks, torch.bfloat16)
    torch.cuda.synchronize()
    step = functools.partial(train_step, model, loss_fn, optimizer, tasks, torch.bfloat16)
    plain_ms = step_ms(step)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wall_ms = step_ms(step)
    kernels = cuda_kernel_events(prof.events())
    gpu = summarize_kernels([(e.name, e.time_range.start, e.time_range.end) for e in kernels], STEPS)
    per_kernel, count = defaultdict(float), defaultdict(int)
    for e in kernels:
        per_kernel[e.name] += e.time_range.elapsed_us()
        count[e.name] += 1
    print(
        f"\n## {variant} at {shape.name}: step {plain_ms:.2f} ms, {wall_ms:.2f} ms profiled, GPU busy {gpu['gpu_busy_ms']:.2f} ms, "
        f"kernels {gpu['gpu_kernel_ms']:.2f} ms in {gpu['gpu_launches']:.0f} launches; profiled steps ended "
        f"{time.strftime('%H:%M:%S')} (to match a clock log)"
    )
    families = {
        k[4:-3]: v for k, v in gpu.items() if k.endswith("_ms") and k not in ("gpu_busy_ms", "gpu_kernel_ms")
    }
    for label, ms in sorted(families.items(), key=lambda kv: -kv[1]):
        print(f"  {label:12s} {ms:8.3f} ms")
    print("  top kernels (ms a step, launches a step):")
    for name, us in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:18]:
        print(f"    {us / 1e3 / STEPS:8.3f} {count[name] // STEPS:4d}  {name[:110]}")
    print("  GPU idle between kernels by gap size (ms a step, gaps a step):")
    for bound, us, n in idle_by_size(kernels):
        print(f"    < {bound:>5} us {us / 1e3 / STEPS:8.3f} {n / STEPS:7.1f}")
    print("  GPU idle between kernels (ms a step, gaps a step; the kernel before -> the one after):")
    for (before, after), (us, n) in idle_gaps(kernels)[:10]:
        print(f"    {us / 1e3 / STEPS:8.3f} {n // STEPS:4d}  {before[:50]} -> {after[:50]}")
    del model, optimizer, loss_fn
    torch.cuda.empty_cache()


def main():
    shape = SHAPES[sys.argv[1]]
    print(f"# {torch.cuda.get_device_name()}, {shape.label()}, bf16 autocast, {STEPS} steps after {WARMUP}")
    for variant in sys.argv[2:]:
        profile_variant(shape, variant)


if __name__ == "__main__":
    main()
