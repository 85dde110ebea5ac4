"""The fused linear cross-entropy against ``torch.compile`` with the GPU's clock and power beside
each timing: whether the gap moves with the SM clock the card settles at under load.

At 16384 x 128256 x 4096 as ``kernel_suite`` makes it (bf16, 1/97 of the targets ignored), rounds
alternate ours (upstream gradient 1, ``loss.backward()``: the backward's scale is skipped), ours
with an upstream gradient of 0.999 (the scale pass runs) and compile, in ABCCBA order; each
``bench`` interval is matched against ``nvidia-smi`` samples taken every 50 ms in the background.

    PYTHONPATH=. python3 reports/data/kernel_suite/diagnostics/flce_clocks.py [TOKENSxVOCAB] [ROUNDS]
"""

import statistics
import subprocess
import sys
import time
from datetime import datetime

import torch
import torch._functorch.config
import torch.nn.functional as F

from common.timing import bench
from tritonlab.ops import fused_linear_cross_entropy

HIDDEN = 4096
QUERY = "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu"


def eager(x, w, y):
    return F.cross_entropy(F.linear(x, w).float(), y)


def samples(out: str) -> list[tuple[float, list[str]]]:
    """(epoch seconds, [clock, power, temperature]) per nvidia-smi line."""
    rows = []
    for line in out.splitlines():
        stamp, *values = (v.strip() for v in line.split(","))
        if len(values) == 3:
            rows.append((datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp(), values))
    return rows


def sampled(log: list[tuple[float, list[str]]], start: float, stop: float) -> str:
    rows = [values for t, values in log if start <= t <= stop]
    if not rows:
        return "no samples"
    clock, power, temp = (statistics.mean(float(r[i]) for r in rows) for i in range(3))
    return f"{clock:6.0f} MHz {power:5.0f} W {temp:3.0f} C ({len(rows)} samples)"


def main(tokens: int, vocab: int, rounds: int) -> None:
    torch.manual_seed(0)
    torch._functorch.config.donated_buffer = False
    compiled = torch.compile(eager, dynamic=False)
    x = torch.randn(tokens, HIDDEN, device="cuda").to(torch.bfloat16).requires_grad_()
    w = (torch.randn(vocab, HIDDEN, device="cuda") / HIDDEN**0.5).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, vocab, (tokens,), device="cuda")
    y[::97] = -100
    scaled = torch.tensor(0.999, device="cuda")
    calls = {
        "ours": lambda: torch.autograd.grad(fused_linear_cross_entropy(x, w, y), (x, w)),
        "ours, upstream 0.999": lambda: torch.autograd.grad(
            fused_linear_cross_entropy(x, w, y), (x, w), scaled
        ),
        "compile": lambda: torch.autograd.grad(compiled(x, w, y), (x, w)),
    }
    for call in calls.values():
        call()
    smi = subprocess.Popen(
        ["nvidia-smi", QUERY, "--format=csv,noheader,nounits", "-lms", "50"],
        stdout=subprocess.PIPE,
        text=True,
    )
    intervals = []
    names = list(calls)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            start = time.time()
            ms = bench(calls[name], warmup_ms=200, rep_ms=1000).ms
            intervals.append((name, r, ms, start, time.time()))
    smi.terminate()
    out, _ = smi.communicate()
    log = samples(out)
    print(f"# {tokens}x{vocab}x{HIDDEN} bf16, {torch.cuda.get_device_name()}, {rounds} rounds", flush=True)
    for name, r, ms, start, stop in intervals:
        print(f"round {r} {name:22s} {ms:7.2f} ms  {sampled(log, start, stop)}")
    medians = {name: statistics.median(ms for n, _, ms, _, _ in intervals if n == name) for name in calls}
    for name, med in medians.items():
        print(f"{name:22s} median {med:7.2f} ms  {med / medians['compile']:.3f}x compile")


if __name__ == "__main__":
    shape = sys.argv[1] if len(sys.argv) > 1 else "16384x128256"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    main(*(int(n) for n in shape.split("x")), rounds)
