"""Diagnostic: where PyTorch's own first-use costs in the TransformerNP's first step come from (issue
23's first step at mid: under cProfile, ``torch._C._nn.linear`` 0.095 s over 37 calls, ``torch.rms_norm``
0.072 s over 25, the autograd engine 0.109 s). Each case in a fresh process, on the H100, at mid's
shapes (B = 4, 11 000 tokens, d_model 512): the first and second call of each op with a sync after
each, a bf16 linear at a second row count first called after the first (is the cost per shape, or
once?), with the process warmed beforehand by the same ops at a tiny shape (``warm-tiny``) or by
``tritonlab.preload()`` in its thread (``preload``), and under ``CUDA_MODULE_LOADING=EAGER``. Prints one JSON line per case.

    python3 reports/data/11_autotune/diagnostics/first_use.py
"""

import os
import subprocess
import sys

CHILD = r"""
import json, sys, time
import torch
import torch.nn.functional as F

def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return round((time.perf_counter() - t) * 1e3, 3)

def ops(rows, d=512):
    x = torch.randn(rows, d, device="cuda", requires_grad=True)
    w = torch.randn(d, d, device="cuda", requires_grad=True)
    g = torch.ones(d, device="cuda", requires_grad=True)
    def linear():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return F.linear(x, w)
    def rms():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return F.rms_norm(x, (d,), g, 1e-6)
    return linear, rms

out = {"case": sys.argv[1]}
out["init_ms"] = timed(lambda: torch.zeros(1, device="cuda"))
if sys.argv[1] == "warm-tiny":
    linear, rms = ops(8, 64)
    out["warm_ms"] = timed(lambda: (linear().sum() + rms().sum()).backward())
elif sys.argv[1] == "preload":  # tritonlab's warm-up, in its own thread (which then ends)
    import tritonlab
    out["warm_ms"] = timed(lambda: tritonlab.preload().join())
linear, rms = ops(44000)
out["linear_1"] = timed(linear)
out["linear_2"] = timed(linear)
out["rms_1"] = timed(rms)
out["rms_2"] = timed(rms)
out["backward_1"] = timed(lambda: (linear().float().sum() + rms().float().sum()).backward())
out["backward_2"] = timed(lambda: (linear().float().sum() + rms().float().sum()).backward())
other, _ = ops(40000)
out["linear_other_rows_1"] = timed(other)
print(json.dumps(out))
"""

CASES = (
    ("plain", {}),
    ("warm-tiny", {}),
    ("preload", {}),
    ("eager-loading", {"CUDA_MODULE_LOADING": "EAGER"}),
)
for case, env in CASES:
    run = subprocess.run(
        [sys.executable, "-c", CHILD, case],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
    )
    print(run.stdout.strip() or run.stderr.strip().splitlines()[-1])
