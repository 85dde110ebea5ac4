"""The cross-entropy options against the plain loss at 4096 x 32000 bf16, where calls are bound by
the host: every variant timed in each of several rounds, in a rotated order, so that drift of the
host's speed falls on all of them alike; per round the ratio to the plain loss of that round.
Also the host's time per call alone (the GPU held busy by a sleep queued first, unchecked calls only:
a checked call waits for the GPU).

    PYTHONPATH=. python3 reports/data/kernel_suite/diagnostics/ce_options_ab.py
"""

import statistics
import time

import torch
from triton.testing import do_bench

from tritonlab import ops

SETS = {
    "plain": {},
    "smoothing": {"label_smoothing": 0.1},
    "softcap": {"softcap": 30.0},
    "zloss": {"lse_square_scale": 1e-4},
    "all": {"label_smoothing": 0.1, "softcap": 30.0, "lse_square_scale": 1e-4},
}
ROUNDS = 7


def call_of(logits, target, check, options):
    def call():
        loss = ops.cross_entropy(logits, target, check_targets=check, **options)
        return torch.autograd.grad(loss, logits)

    return call


def host_ms(fn, calls=50):
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000 // 1000 * 200)  # ~0.2 s of GPU sleep queued first
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    ms = (time.perf_counter() - start) * 1e3 / calls
    torch.cuda.synchronize()
    return ms


def main():
    torch.manual_seed(0)
    logits = torch.randn(4096, 32000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, 32000, (4096,), device="cuda")
    calls = {
        (name, check): call_of(logits, target, check, opts)
        for name, opts in SETS.items()
        for check in (True, False)
    }
    for fn in calls.values():
        fn()
    keys = list(calls)
    times = {k: [] for k in keys}
    for r in range(ROUNDS):
        order = keys[r % len(keys) :] + keys[: r % len(keys)]
        for k in order:
            times[k].append(do_bench(calls[k], warmup=25, rep=100))
    print(f"{ROUNDS} rounds, do_bench medians (ms); ratio = per-round ratio to plain, median over rounds")
    for k in keys:
        plain = times[("plain", k[1])]
        ratios = [t / p for t, p in zip(times[k], plain, strict=True)]
        print(
            f"  {k[0]:10s} checked={k[1]!s:5s} median {statistics.median(times[k]):.4f} "
            f"min {min(times[k]):.4f} max {max(times[k]):.4f}  ratio {statistics.median(ratios):.3f}"
            f"  rounds {' '.join(f'{t:.3f}' for t in times[k])}"
        )
    print("host time per call, unchecked, GPU busy (ms):")
    for name in SETS:
        samples = [host_ms(calls[(name, False)]) for _ in range(5)]
        print(f"  {name:10s} {statistics.median(samples):.4f}  ({' '.join(f'{s:.3f}' for s in samples)})")


if __name__ == "__main__":
    main()
