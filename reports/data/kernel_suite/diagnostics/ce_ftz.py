"""Diagnostic: the cross-entropy kernel's options at 16384 x 128256 bf16 (forward + backward), as the
library runs them (``tree``: ex2.approx.ftz in the softcapped sweeps; at its first run, 08:31 UTC,
in every sweep) and with every exp Triton's tl.exp (``tl.exp``), each in a fresh process (the switch
is a module constexpr read at the first compile). Prints ms per variant and the ratio to the plain
loss of the same process, timed first and again last.

    python3 reports/data/kernel_suite/diagnostics/ce_ftz.py
"""

import json
import subprocess
import sys

CHILD = r"""
import json, sys
import torch, triton, triton.language as tl
import importlib
ce = importlib.import_module("tritonlab.ops.cross_entropy")  # the module: tritonlab.ops exports the function
if sys.argv[1] == "tl.exp":
    ce._FTZ_EXP = tl.constexpr(False)
rows, vocab = 16384, 128256
torch.manual_seed(0)
logits = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16, requires_grad=True)
target = torch.randint(0, vocab, (rows,), device="cuda")
sets = {"plain": {}, "zloss": {"lse_square_scale": 1e-4}, "smoothing": {"label_smoothing": 0.1},
        "softcap": {"softcap": 30.0}, "all": {"label_smoothing": 0.1, "softcap": 30.0, "lse_square_scale": 1e-4},
        "plain again": {}}
out = {}
for name, kw in sets.items():
    step = lambda: torch.autograd.grad(ce.cross_entropy(logits, target, **kw), logits)[0]
    out[name] = triton.testing.do_bench(step, warmup=100, rep=500)
print(json.dumps(out))
"""

if __name__ == "__main__":
    print(
        f"# {subprocess.run(['nvidia-smi', '--query-gpu=name', '--format=csv,noheader'], capture_output=True, text=True).stdout.strip()}"
    )
    for exp in ("tree", "tl.exp", "tree"):
        res = subprocess.run([sys.executable, "-c", CHILD, exp], capture_output=True, text=True)
        if res.returncode:
            print(exp, "failed:", res.stderr[-2000:])
            continue
        ms = json.loads(res.stdout.strip().splitlines()[-1])
        print(exp.ljust(7), "  ".join(f"{k} {v:.3f} ms ({v / ms['plain']:.3f}x)" for k, v in ms.items()))
