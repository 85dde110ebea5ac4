"""Diagnostic, as it ran at dd0b157 on an H100 (output: ce_variants_dd0b157-h100.txt; ruff's lint
fixes since). ``ce_head`` is c40aa9a's tritonlab/ops/cross_entropy.py with its relative imports made
absolute, beside this file (``git show c40aa9a:tritonlab/ops/cross_entropy.py``); the peel variants
are settings of dd0b157 that later commits removed.

A/B of the cross-entropy kernel variants at 16384 x 128256 bf16, forward + backward, in one process:
the library at HEAD (ce_head, a copy) against the working tree's kernel under several settings.
Each variant is checked against HEAD's result with the same options, then timed twice (do_bench
medians, order forward then reversed). Writes JSON lines to $OUT/ab.jsonl and a table at the end."""

import dataclasses
import json
import os
import subprocess
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(__file__))
import importlib  # noqa: E402

import ce_head  # noqa: E402

ce = importlib.import_module("tritonlab.ops.cross_entropy")

OUT = os.environ.get("OUT", ".")
log = open(os.path.join(OUT, "ab.jsonl"), "a")  # noqa: SIM115
gpu = (
    "smoke"
    if os.environ.get("SMOKE") == "1"
    else subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True
    ).stdout.strip()
)
print("#", gpu, torch.__version__, triton.__version__, flush=True)

SMOKE = os.environ.get("SMOKE") == "1"
DEV = "cpu" if SMOKE else "cuda"
rows, vocab = (64, 3000) if SMOKE else (16384, 128256)
torch.manual_seed(0)
logits = torch.randn(rows, vocab, device=DEV, dtype=torch.bfloat16).mul_(2.0).requires_grad_()
target = torch.randint(0, vocab, (rows,), device=DEV)
target[::97] = -100
OPTS = {
    "plain": {},
    "smoothing": dict(label_smoothing=0.1),
    "softcap": dict(softcap=30.0),
    "zloss": dict(lse_square_scale=1e-4),
    "all": dict(label_smoothing=0.1, softcap=30.0, lse_square_scale=1e-4),
}
D, O = ce.DEFAULT_SETTINGS, ce.OPTIONS_SETTINGS
R = dataclasses.replace
VARIANTS = [  # (name, option set, settings or None for HEAD)
    ("head", "plain", None),
    ("new", "plain", D),
    ("new nofixup", "plain", R(D, target_fixup=False)),
    ("head", "smoothing", None),
    ("new 64K peel", "smoothing", D),
    ("new 64K nopeel", "smoothing", R(D, peel=False)),
    ("head", "softcap", None),
    ("new 32K peel", "softcap", O),
    ("new 32K peel poly", "softcap", R(O, poly_exp2=True)),
    ("new 64K nopeel", "softcap", R(O, block_bytes=65536, peel=False)),
    ("new 64K nopeel poly", "softcap", R(O, block_bytes=65536, peel=False, poly_exp2=True)),
    ("new 32K nopeel", "softcap", R(O, peel=False)),
    ("head", "zloss", None),
    ("new", "zloss", D),
    ("head", "all", None),
    ("new 32K peel", "all", O),
    ("new 32K peel poly", "all", R(O, poly_exp2=True)),
    ("new 64K nopeel", "all", R(O, block_bytes=65536, peel=False)),
    ("new 64K nopeel poly", "all", R(O, block_bytes=65536, peel=False, poly_exp2=True)),
]


def step(opt, settings):
    kw = OPTS[opt]
    if settings is None:
        return lambda: torch.autograd.grad(ce_head.cross_entropy(logits, target, **kw), logits)[0]
    o = ce.CrossEntropyOptions(
        None, kw.get("label_smoothing", 0.0), kw.get("softcap"), kw.get("lse_square_scale", 0.0)
    )
    return lambda: torch.autograd.grad(
        ce.CrossEntropyFunction.apply(logits, target, -100, "mean", False, True, settings, o), logits
    )[0]


def loss_of(opt, settings):
    kw = OPTS[opt]
    with torch.no_grad():
        if settings is None:
            return ce_head.cross_entropy(logits.detach(), target, **kw).float().item()
        o = ce.CrossEntropyOptions(
            None, kw.get("label_smoothing", 0.0), kw.get("softcap"), kw.get("lse_square_scale", 0.0)
        )
        return (
            ce.CrossEntropyFunction.apply(logits.detach(), target, -100, "mean", False, True, settings, o)
            .float()
            .item()
        )


ref = {}
for name, opt, settings in VARIANTS:
    try:
        g = step(opt, settings)()[:2048].float()
        loss = loss_of(opt, settings)
        if settings is None:
            ref[opt] = (g, loss)
            check = {}
        else:
            g0, l0 = ref[opt]
            check = {
                "grad_rel": ((g - g0).norm() / g0.norm()).item(),
                "grad_maxabs": (g - g0).abs().max().item(),
                "loss_diff": loss - l0,
                "loss": loss,
            }
        del g
        rec = {"name": name, "opt": opt, **check}
    except Exception as e:  # noqa: BLE001
        rec = {"name": name, "opt": opt, "error": repr(e)[-500:]}
    print(json.dumps(rec), flush=True)
    log.write(json.dumps(rec) + "\n")
    log.flush()

times = {}
if SMOKE:
    sys.exit(0)
for rnd, order in enumerate((VARIANTS, VARIANTS[::-1])):
    for name, opt, settings in order:
        try:
            ms = triton.testing.do_bench(step(opt, settings), warmup=50, rep=300, return_mode="median")
        except Exception as e:  # noqa: BLE001
            ms = float("nan")
            print(name, opt, "failed", repr(e)[-300:], flush=True)
        times.setdefault((name, opt), []).append(ms)
        rec = {"round": rnd, "name": name, "opt": opt, "ms": ms}
        log.write(json.dumps(rec) + "\n")
        log.flush()

plain = {n: times[(n, "plain")] for n in ("head", "new")}
print(f"# {gpu}; ms per round (forward order, reversed); ratio = mean over rounds / same-module plain")
for (name, opt), ms in times.items():
    base = plain["head" if name == "head" else "new"]
    r = sum(a / b for a, b in zip(ms, base, strict=True)) / len(ms)
    rh = sum(a / b for a, b in zip(ms, plain["head"], strict=True)) / len(ms)
    print(
        f"{opt:10s} {name:20s} "
        + " ".join(f"{m:.3f}" for m in ms)
        + f"  ratio {r:.3f}  vs head plain {rh:.3f}",
        flush=True,
    )
