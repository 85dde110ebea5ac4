r"""The bf16 Gluon forward with its masked last tile in a loop of its own (the tree's) against the
kernel before that change (``forward_hopper.py`` at 214ac47, whose main loop ptxas masked on every
tile), in one process, kernel time alone, alternating, at mid and large (D = 64, the model's strided
layout) and mid-d128; each output checked against the other first.

    git show 214ac47:tritonlab/attention/forward_hopper.py | sed 's/from \.\._/from tritonlab._/' > /tmp/before.py
    PYTHONPATH=. python3 reports/data/02_attn_fwd/diagnostics/gluon_peeled_tail.py /tmp/before.py
"""

import functools
import importlib.util
import sys

import torch
from triton.testing import do_bench

from common.attention_bench import make_inputs, tnp_case, with_head_dim
from tritonlab.attention import forward_hopper
from tritonlab.attention._common import LOG2E
from tritonlab.attention.forward import _forward_outputs


def load_before(path: str):
    """forward_hopper.py at 214ac47 (``git show``, its relative imports made absolute), from a file."""
    spec = importlib.util.spec_from_file_location("forward_hopper_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(module, q, k, v):
    o, lse = _forward_outputs(q)
    module.forward(q, k, v, o, lse, q.shape[-1] ** -0.5 * LOG2E)
    return o


def main():
    before = load_before(sys.argv[1])
    for name, d in (("mid", 64), ("large", 64), ("mid", 128)):
        case = with_head_dim(tnp_case(name), d)
        q, k, v = make_inputs(case, torch.bfloat16, grad=False)[:3]
        reps = dict(warmup=25, rep=100) if name == "mid" else dict(warmup=1, rep=5)
        new, old = run(forward_hopper, q, k, v), run(before, q, k, v)
        diff = ((new.float() - old.float()).norm() / old.float().norm()).item()
        times = {"peeled": [], "before": []}
        for _ in range(3):  # alternating rounds: clock drift falls on both
            times["peeled"].append(do_bench(functools.partial(run, forward_hopper, q, k, v), **reps))
            times["before"].append(do_bench(functools.partial(run, before, q, k, v), **reps))
        peeled, old_ms = min(times["peeled"]), min(times["before"])
        print(
            f"{case.label}: peeled {peeled:.3f} ms, before {old_ms:.3f} ms ({old_ms / peeled:.3f}x), "
            f"rounds {times}, rel diff {diff:.1e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
