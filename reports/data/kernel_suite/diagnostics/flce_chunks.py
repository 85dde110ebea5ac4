"""The fused linear cross-entropy's chunk size against ``torch.compile`` of linear + cross-entropy,
forward + backward, bf16, hidden 4 096: per shape, rounds alternating compile with ours at several
``chunk_rows`` in one process (``bench`` medians), and each call's peak memory over its inputs.
Larger chunks mean fewer read-modify-write passes over dW (``addmm_`` with beta = 1, once per chunk
after the first) and taller GEMMs; the issue's memory bound (2.0 GiB at 16 384 x 128 256) caps them.

    PYTHONPATH=. python3 reports/data/kernel_suite/diagnostics/flce_chunks.py [TOKENSxVOCAB ...]
"""

import statistics
import sys

import torch
import torch._functorch.config
import torch.nn.functional as F

from common.timing import bench
from tritonlab.ops import fused_linear_cross_entropy
from tritonlab.ops.fused_linear_cross_entropy import chunk_rows_for

SHAPES = [(8192, 128256), (16384, 128256)]
HIDDEN = 4096
ROUNDS = 3
CHUNK_MIB = (512, 640, 768, 832, 1024)


def peak_gib(call) -> float:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak / 2**30


def measure(compiled, tokens: int, vocab: int) -> None:
    x = torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(vocab, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    y = torch.randint(0, vocab, (tokens,), device="cuda")

    def ours(rows):
        return torch.autograd.grad(fused_linear_cross_entropy(x, w, y, chunk_rows=rows), (x, w))

    calls = {"compile": lambda: torch.autograd.grad(compiled(x, w, y), (x, w))}
    ref = calls["compile"]()
    seen = set()
    for mib in CHUNK_MIB:
        rows = chunk_rows_for(tokens, vocab, 2, mib * 2**20)
        if rows in seen:
            continue
        seen.add(rows)
        name = f"ours {mib} MiB ({rows} rows)"
        calls[name] = lambda rows=rows: ours(rows)
        got = calls[name]()
        err = max(
            ((g.float() - r.float()).norm() / r.float().norm()).item() for g, r in zip(got, ref, strict=True)
        )
        print(f"{tokens}x{vocab} {name}: grad rel err vs compile {err:.2e}", flush=True)
    mem = {name: peak_gib(call) for name, call in calls.items()}
    samples = {name: [] for name in calls}
    for round_ in range(ROUNDS):
        for name in list(calls) if round_ % 2 == 0 else list(reversed(calls)):
            samples[name].append(bench(calls[name], warmup_ms=200, rep_ms=1000).ms)
    comp = statistics.median(samples["compile"])
    for name in calls:
        med = statistics.median(samples[name])
        print(
            f"{tokens}x{vocab} {name}: {med:.2f} ms (rounds {' '.join(f'{s:.2f}' for s in samples[name])}), "
            f"{med / comp:.3f}x compile, peak {mem[name]:.2f} GiB over the inputs",
            flush=True,
        )


def main(shapes):
    torch.manual_seed(0)
    torch._functorch.config.donated_buffer = False
    compiled = torch.compile(lambda x, w, y: F.cross_entropy(F.linear(x, w).float(), y), dynamic=False)
    for tokens, vocab in shapes:
        measure(compiled, tokens, vocab)
        torch.cuda.empty_cache()


def parse(argv):
    return [tuple(int(p) for p in a.split("x")) for a in argv] or SHAPES


if __name__ == "__main__":
    main(parse(sys.argv[1:]))
