"""Diagnostic, as it ran at 102b7b1 on an H100 (output: ce_variants_102b7b1-h100.txt; the
``poly_exp2`` setting it turns off was removed after it, so it needs 102b7b1's tree to run).

The cross-entropy kernel at 16384 x 128256 bf16, forward + backward, in one process, as the library
ran before this work (``ce_head``: c40aa9a's tritonlab/ops/cross_entropy.py with its
relative imports made absolute, ``git show c40aa9a:tritonlab/ops/cross_entropy.py``, in the folder
given as the first argument) and as it runs now, with its defaults and with one setting changed:
``target_fixup=False`` (the target's gradient through a comparison a logit) and ``poly_exp2=False``
(every exponential of the fixed max's sweep 1 on the special-function unit). Each variant's gradient
(first 2048 rows) is checked against the old module's with the same options, then every variant is
timed twice (``do_bench`` medians; the list in order, then reversed). Ratios are to the plain loss
of the same module. Writes JSON lines to $OUT/ce_variants.jsonl and a table at the end.

    python3 reports/data/kernel_suite/diagnostics/ce_variants.py DIR_WITH_CE_HEAD
"""

import dataclasses
import importlib
import json
import os
import subprocess
import sys

import torch
import triton

sys.path.insert(0, sys.argv[1])
ce_head = importlib.import_module("ce_head")
ce = importlib.import_module("tritonlab.ops.cross_entropy")  # the module: tritonlab.ops exports the function

OUT = os.environ.get("OUT", ".")
gpu = subprocess.run(
    ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True
).stdout.strip()
print("#", gpu, torch.__version__, triton.__version__, flush=True)

rows, vocab = 16384, 128256
torch.manual_seed(0)
logits = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16).mul_(2.0).requires_grad_()
target = torch.randint(0, vocab, (rows,), device="cuda")
target[::97] = -100
OPTS = {
    "plain": {},
    "smoothing": dict(label_smoothing=0.1),
    "softcap": dict(softcap=30.0),
    "zloss": dict(lse_square_scale=1e-4),
    "all": dict(label_smoothing=0.1, softcap=30.0, lse_square_scale=1e-4),
}
D = ce.DEFAULT_SETTINGS
VARIANTS = [("before", opt, None) for opt in OPTS]  # (name, options, settings: None for ce_head)
VARIANTS += [("now", opt, D) for opt in OPTS]
VARIANTS += [
    ("now target compared", "plain", dataclasses.replace(D, target_fixup=False)),
    ("now no poly exp2", "softcap", dataclasses.replace(D, poly_exp2=False)),
    ("now no poly exp2", "all", dataclasses.replace(D, poly_exp2=False)),
]


def step(opt, settings):
    kw = OPTS[opt]
    if settings is None:
        return lambda: torch.autograd.grad(ce_head.cross_entropy(logits, target, **kw), logits)[0]
    options = ce.CrossEntropyOptions(
        None, kw.get("label_smoothing", 0.0), kw.get("softcap"), kw.get("lse_square_scale", 0.0)
    )
    return lambda: torch.autograd.grad(
        ce.CrossEntropyFunction.apply(logits, target, -100, "mean", False, True, settings, options), logits
    )[0]


with open(os.path.join(OUT, "ce_variants.jsonl"), "a") as log:
    ref = {}
    for name, opt, settings in VARIANTS:
        g = step(opt, settings)()[:2048].float()
        if settings is None:
            ref[opt] = g
            rec = {"name": name, "opt": opt}
        else:
            rec = {
                "name": name,
                "opt": opt,
                "grad_rel_to_before": ((g - ref[opt]).norm() / ref[opt].norm()).item(),
            }
        del g
        print(json.dumps(rec), flush=True)
        log.write(json.dumps(rec) + "\n")
    del ref

    times = {}
    for rnd, order in enumerate((VARIANTS, VARIANTS[::-1])):
        for name, opt, settings in order:
            ms = triton.testing.do_bench(step(opt, settings), warmup=50, rep=300, return_mode="median")
            times.setdefault((name, opt), []).append(ms)
            log.write(json.dumps({"round": rnd, "name": name, "opt": opt, "ms": ms}) + "\n")
            log.flush()

print(
    f"# {gpu}; ms in each round (in order, reversed); ratio: mean over the rounds of ms / the same module's plain"
)
for (name, opt), ms in times.items():
    plain = times[("before" if name == "before" else "now", "plain")]
    ratio = sum(a / b for a, b in zip(ms, plain, strict=True)) / len(ms)
    print(f"{opt:10s} {name:22s} " + " ".join(f"{m:.3f}" for m in ms) + f"  ratio {ratio:.3f}", flush=True)
