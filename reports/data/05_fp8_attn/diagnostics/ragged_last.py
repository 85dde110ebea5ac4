"""The Gluon forwards (bf16 ``forward_hopper``, FP8 ``fp8_hopper``) with every head's ragged last
query block run after all the full ones, its rows-less warpgroups only releasing the K/V ring
(``forward_hopper.ragged_last``, ``release_ring``), against the same kernels in head order with
every warpgroup computing (the source before that change, rebuilt by the edits below), in
alternating rounds beside SDPA cuDNN; mid, a mid whose Lq is a multiple of the 192-row block
(no ragged block: what the tail costs), and large.

    PYTHONPATH=. python3 reports/data/05_fp8_attn/diagnostics/ragged_last.py
"""

import dataclasses
import functools
import pathlib
import sys

# What the "head order" variants change back in the library's source.
BF16_EDITS = [
    (
        "pid_bh, row_start = ragged_last(pid, Lq, BLOCK_M)",
        "pid_bh = pid // n_m\n        row_start = (pid % n_m) * BLOCK_M",
    ),
    ("    if row_start < Lq:\n        _softmax_rows(", "    if True:\n        _softmax_rows("),
]
FP8_EDITS = [
    (
        "bh, row_start = ragged_last(gl.program_id(0), Lq, BLOCK_M)",
        "pid = gl.program_id(0)\n    bh = pid // gl.cdiv(Lq, BLOCK_M)\n    row_start = (pid % gl.cdiv(Lq, BLOCK_M)) * BLOCK_M",
    ),
    ("    if row_start < Lq:\n        _fp8_softmax_rows(", "    if True:\n        _fp8_softmax_rows("),
]


def bf16_forward(module, q, k, v):
    from tritonlab.attention._common import LOG2E
    from tritonlab.attention.forward import _forward_outputs

    o, lse = _forward_outputs(q)
    module.forward(q, k, v, o, lse, q.shape[-1] ** -0.5 * LOG2E)
    return o


def main():
    import torch

    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from gluon_fp8_configs import cudnn, rel
    from patched import alternate, fp8_forward, load_patched, replace_all

    from common.attention_bench import make_inputs, tnp_case
    from tritonlab.attention import forward_hopper, fp8_hopper

    bf16_before = load_patched(
        "forward_hopper.py", "forward_hopper_head_order", lambda s: replace_all(s, BF16_EDITS)
    )
    fp8_before = load_patched("fp8_hopper.py", "fp8_hopper_head_order", lambda s: replace_all(s, FP8_EDITS))
    mid = tnp_case("mid")
    cases = [
        ("mid", mid, 4),
        ("mid-full", dataclasses.replace(mid, lq=57 * 192), 2),
        ("large", tnp_case("large"), 1),
    ]
    for name, case, rounds in cases:
        q, k, v = make_inputs(case, torch.bfloat16, grad=False)[:3]
        print(f"{name}: q {tuple(q.shape)}, k {tuple(k.shape)}", flush=True)
        runs = {
            "bf16 ragged-last": functools.partial(bf16_forward, forward_hopper, q, k, v),
            "bf16 head-order": functools.partial(bf16_forward, bf16_before, q, k, v),
            "fp8 ragged-last": functools.partial(fp8_forward, fp8_hopper, q, k, v),
            "fp8 head-order": functools.partial(fp8_forward, fp8_before, q, k, v),
        }
        ref = cudnn(q, k, v)
        outs = {label: call() for label, call in runs.items()}
        print(f"{name} rel err vs cudnn: " + ", ".join(f"{lb} {rel(o, ref):.4g}" for lb, o in outs.items()))
        same = [torch.equal(outs["bf16 ragged-last"], outs["bf16 head-order"]),
                torch.equal(outs["fp8 ragged-last"], outs["fp8 head-order"])]  # fmt: skip
        print(f"{name} bitwise equal to head order: bf16 {same[0]}, fp8 {same[1]}", flush=True)
        reps = dict(warmup=25, rep=150) if name != "large" else dict(warmup=1, rep=5)
        for pair in (("bf16 ragged-last", "bf16 head-order"), ("fp8 ragged-last", "fp8 head-order")):
            alternate(name, rounds, reps, functools.partial(cudnn, q, k, v), {p: runs[p] for p in pair})


if __name__ == "__main__":
    main()
