"""The Gluon FP8 forward of an older source against today's, in alternating rounds at mid, beside
SDPA cuDNN and our bf16 forward (the FP8 calls with their K/V quantisation launch). Phase 05 read
1.793 ms at ``1fb999c`` and 2.147 ms at ``d5f686a`` for the same cell; the sm_90a SASS of the two
kernels differs in its integer and uniform-register instructions (IMAD 679 against 719, R2UR 45
against 23). Each log names the commit it ran at; the ones with a ``today split`` column ran while
today's source had a split tail (since dropped).

    git show 1fb999c:tritonlab/attention/fp8_hopper.py > /tmp/fp8_hopper_1fb999c.py
    PYTHONPATH=. python3 reports/data/05_fp8_attn/diagnostics/fp8_regression.py /tmp/fp8_hopper_1fb999c.py
"""

import functools
import pathlib
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from patched import fp8_forward, load_source  # noqa: E402

from common.attention_bench import SDPA, make_inputs, sdpa, tnp_case  # noqa: E402
from tritonlab.attention import attention_forward, fp8_hopper  # noqa: E402


def old_imports(source: str) -> str:
    """An older ``fp8_hopper.py`` took ``shared_layout`` from ``forward_hopper``; it is in
    ``tritonlab._gluon`` now."""
    return source.replace(
        "SOFTMAX_WARPGROUPS, descriptor, shared_layout",
        "SOFTMAX_WARPGROUPS, descriptor\nfrom tritonlab._gluon import shared_layout",
    )


def main():
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    old = load_source(sys.argv[1], "fp8_hopper_old", old_imports)
    q, k, v = make_inputs(tnp_case("mid"), torch.bfloat16, grad=False)[:3]
    o_old, o_new = fp8_forward(old, q, k, v), fp8_forward(fp8_hopper, q, k, v)
    print(f"mid: old and today's forward bitwise equal: {torch.equal(o_old, o_new)}", flush=True)
    calls = {
        "cudnn": functools.partial(sdpa(SDPA["sdpa-cudnn"]), q, k, v),
        "bf16": functools.partial(attention_forward, q, k, v),
        "fp8 old": functools.partial(fp8_forward, old, q, k, v),
        "fp8 today": functools.partial(fp8_forward, fp8_hopper, q, k, v),
    }
    for r in range(6):
        order = calls if r % 2 == 0 else dict(reversed(calls.items()))
        t = {label: do_bench(call, warmup=25, rep=150) for label, call in order.items()}
        line = ", ".join(f"{label} {ms:.3f} ms ({t['cudnn'] / ms:.3f}x)" for label, ms in t.items())
        print(f"round {r}: {line}; today / old {t['fp8 today'] / t['fp8 old']:.3f}", flush=True)


if __name__ == "__main__":
    main()
