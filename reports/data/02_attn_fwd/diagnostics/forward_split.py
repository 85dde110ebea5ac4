"""The Gluon bf16 forward's split tail: the last wave's query blocks (where they fill at most half
the SMs) run in a launch of their own as programs over key chunks, merged by ``combine_parts``,
against the same forward without the split (``tail=(0, 1)``), in alternating rounds beside SDPA
cuDNN. Mid (1 856 query blocks: 14 waves and 8 blocks on 132 SMs), at the model's strided layout.
Given a path to another ``forward_hopper.py`` source (e.g. ``git show b79a3a8:tritonlab/attention/
forward_hopper.py``, the chunks in a launch of their own), its split forward is timed beside.

    PYTHONPATH=. python3 reports/data/02_attn_fwd/diagnostics/forward_split.py [other_forward_hopper.py]
"""

import functools
import importlib.util
import pathlib
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from common.attention_bench import make_inputs, tnp_case
from tritonlab._runtime import cdiv, sm_count
from tritonlab.attention import forward_hopper
from tritonlab.attention._common import LOG2E, tail_split
from tritonlab.attention.forward import _forward_outputs


def load_other(path: str):
    """A ``forward_hopper.py`` source imported from a file of its own (Gluon reads a kernel's source
    from its file), its relative imports made absolute."""
    source = pathlib.Path(path).read_text().replace("from .._", "from tritonlab._")
    source = source.replace("from ._common", "from tritonlab.attention._common")
    file = pathlib.Path(tempfile.mkdtemp()) / "forward_hopper_other.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location("forward_hopper_other", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def forward(q, k, v, tail, module=forward_hopper):
    o, lse = _forward_outputs(q)
    module.forward(q, k, v, o, lse, q.shape[-1] ** -0.5 * LOG2E, tail=tail)
    return o, lse


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v)


def main():
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    q, k, v = make_inputs(tnp_case("mid"), torch.bfloat16, grad=False)[:3]
    B, H, Lq, D = q.shape
    block_n = forward_hopper.CONFIGS[D][0]
    programs = cdiv(Lq, forward_hopper.BLOCK_M) * B * H
    auto = tail_split(programs, sm_count(q.device), cdiv(k.shape[2], block_n))
    (o, lse), (o0, lse0) = forward(q, k, v, auto), forward(q, k, v, (0, 1))
    diff = ((o.float() - o0.float()).abs().max() / o0.float().abs().max()).item()
    print(f"mid: q {tuple(q.shape)}, k {tuple(k.shape)}; {programs} query blocks; tail_split -> {auto}; "
          f"split vs whole: o max rel diff {diff:.3g}, lse max abs diff {(lse - lse0).abs().max().item():.3g}",
          flush=True)  # fmt: skip
    reps = dict(warmup=25, rep=150)
    calls = {
        "cudnn": functools.partial(cudnn, q, k, v),
        "split": functools.partial(forward, q, k, v, auto),
        "whole": functools.partial(forward, q, k, v, (0, 1)),
    }
    if len(sys.argv) > 1:
        other = load_other(sys.argv[1])
        o1 = forward(q, k, v, auto, other)[0]
        print(f"other source's split vs this one's: o bitwise equal {torch.equal(o1, o)}", flush=True)
        calls["other split"] = functools.partial(forward, q, k, v, auto, other)
    for r in range(8):
        order = calls if r % 2 == 0 else dict(reversed(calls.items()))
        t = {label: do_bench(call, **reps) for label, call in order.items()}
        line = ", ".join(f"{label} {ms:.3f} ms ({t['cudnn'] / ms:.3f}x)" for label, ms in t.items())
        print(f"round {r}: {line}; split / whole {t['split'] / t['whole']:.4f}", flush=True)


if __name__ == "__main__":
    main()
