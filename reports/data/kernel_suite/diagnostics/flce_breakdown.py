"""The fused linear cross-entropy against ``torch.compile`` of linear + cross-entropy, forward +
backward, bf16, hidden 4 096: three rounds alternating the two in one process (``bench`` medians),
then where one call of ours spends its GPU time (torch.profiler, kernels grouped: the GEMMs, the
cross-entropy kernel, the rest). Shows whether a slower run is the GPU's (both move) or ours.

    PYTHONPATH=. python3 reports/data/kernel_suite/diagnostics/flce_breakdown.py
"""

import collections
import statistics

import torch
import torch._functorch.config
import torch.nn.functional as F

from common.timing import bench, cuda_kernel_events
from tritonlab.ops import fused_linear_cross_entropy

SHAPES = [(8192, 128256), (16384, 128256)]
HIDDEN = 4096
ROUNDS = 3


def group(name: str) -> str:
    if "cross_entropy" in name:
        return "cross-entropy kernel"
    if "gemm" in name.lower() or "sm90" in name or "cutlass" in name or "nvjet" in name:
        return "GEMM"
    return "other"


def main():
    torch.manual_seed(0)
    torch._functorch.config.donated_buffer = False
    compiled = torch.compile(lambda x, w, y: F.cross_entropy(F.linear(x, w).float(), y), dynamic=False)
    for tokens, vocab in SHAPES:
        x = torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(vocab, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
        y = torch.randint(0, vocab, (tokens,), device="cuda")
        calls = {
            "ours": lambda x=x, w=w, y=y: torch.autograd.grad(fused_linear_cross_entropy(x, w, y), (x, w)),
            "compile": lambda x=x, w=w, y=y: torch.autograd.grad(compiled(x, w, y), (x, w)),
        }
        samples = {name: [] for name in calls}
        for round_ in range(ROUNDS):
            for name in list(calls) if round_ % 2 == 0 else list(reversed(calls)):
                samples[name].append(bench(calls[name], warmup_ms=200, rep_ms=1000).ms)
        ours, comp = (statistics.median(samples[n]) for n in calls)
        print(
            f"{tokens}x{vocab}: ours {ours:.2f} ms (rounds {' '.join(f'{s:.2f}' for s in samples['ours'])}), "
            f"compile {comp:.2f} ms (rounds {' '.join(f'{s:.2f}' for s in samples['compile'])}): {ours / comp:.3f}x",
            flush=True,
        )
        for name, call in calls.items():
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                call()
                torch.cuda.synchronize()
            totals = collections.Counter()
            for e in cuda_kernel_events(prof.key_averages()):
                totals[group(e.key)] += e.self_device_time_total / 1e3
            top = sorted(cuda_kernel_events(prof.key_averages()), key=lambda e: -e.self_device_time_total)[:4]
            print(
                f"  {name}: "
                + ", ".join(f"{k} {v:.2f} ms" for k, v in totals.most_common())
                + " | top: "
                + "; ".join(f"{e.key[:60]} x{e.count} {e.self_device_time_total / 1e3:.2f} ms" for e in top),
                flush=True,
            )


if __name__ == "__main__":
    main()
