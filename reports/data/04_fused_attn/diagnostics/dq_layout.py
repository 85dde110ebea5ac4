"""The fused backward's dQ sum on Hopper: zeroed by Δ's launch and kept in the model's (B, L, H, D)
layout (so its bf16 copy is one contiguous conversion), against the way before -- a separate
``torch.zeros`` fill of a (B, H, L, D) sum and a transposing ``copy_`` into the model's layout --
in alternating rounds, the same Gluon dK/dV + dQ kernel in both. Each piece around the kernel is
timed alone too. Mid and large at the model's strided layout.

    PYTHONPATH=. python3 reports/data/04_fused_attn/diagnostics/dq_layout.py
"""

import functools

import torch
from triton.testing import do_bench

from common.attention_bench import make_inputs, tnp_case
from tritonlab.attention import backward_hopper, fused
from tritonlab.attention._common import backward_delta
from tritonlab.attention.backward import _key_grad_buffers, _like_q_layout
from tritonlab.attention.forward import attention_forward


def before(q, k, v, o, lse, do, scale):
    """``fused._fused_backward`` as it was (commit 213751a)."""
    B, H, Lq, D = q.shape
    delta = backward_delta(o, do)
    grads, _ = _key_grad_buffers(k, n_chunks=1)
    dq_sum = torch.zeros((B, H, Lq, D), dtype=torch.float32, device=q.device)
    backward_hopper.dkdv(q, k, v, lse, do, delta, grads, scale, dq=dq_sum)
    dq = _like_q_layout(q)
    dq.copy_(dq_sum)
    return dq, grads


def pieces(q, o, do):
    """ms of each piece around the kernel, before and after."""
    B, H, Lq, D = q.shape
    contiguous_sum = torch.zeros((B, H, Lq, D), dtype=torch.float32, device=q.device)
    model_sum = _like_q_layout(q, torch.float32).zero_()
    reps = dict(warmup=25, rep=100)
    return {
        "before: zeros": do_bench(
            lambda: torch.zeros((B, H, Lq, D), dtype=torch.float32, device=q.device), **reps
        ),
        "before: delta": do_bench(lambda: backward_delta(o, do), **reps),
        "before: copy_": do_bench(lambda: _like_q_layout(q).copy_(contiguous_sum), **reps),
        "after: delta+zero": do_bench(lambda: backward_delta(o, do, zero=model_sum), **reps),
        "after: to(bf16)": do_bench(lambda: model_sum.to(q.dtype), **reps),
    }


def main():
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    for name, rounds in (("mid", 4), ("large", 1)):
        q, k, v, do = make_inputs(tnp_case(name), torch.bfloat16, grad=False)
        scale = q.shape[-1] ** -0.5
        o, lse = attention_forward(q, k, v, scale)
        old, new = before(q, k, v, o, lse, do, scale), fused._fused_backward(q, k, v, o, lse, do, scale)
        err = max((a.float() - b.float()).abs().max().item() / b.float().abs().max().item() for a, b in
                  ((new[0], old[0]), (new[1], old[1])))  # fmt: skip
        same_layout = new[0].stride() == old[0].stride()
        print(
            f"{name}: q {tuple(q.shape)}; after vs before: max rel diff {err:.3g}, dq strides equal {same_layout}"
        )
        if name == "mid":
            print(
                "  " + ", ".join(f"{p} {ms * 1e3:.1f} us" for p, ms in pieces(q, o, do).items()), flush=True
            )
        reps = dict(warmup=10, rep=100) if name == "mid" else dict(warmup=1, rep=5)
        calls = {"before": functools.partial(before, q, k, v, o, lse, do, scale),
                 "after": functools.partial(fused._fused_backward, q, k, v, o, lse, do, scale)}  # fmt: skip
        for r in range(rounds):
            times = {label: do_bench(call, **reps) for label, call in calls.items()}
            print(f"{name} round {r}: backward before {times['before']:.3f} ms, after {times['after']:.3f} ms;"
                  f" after / before {times['after'] / times['before']:.4f}", flush=True)  # fmt: skip
        del q, k, v, do, o, lse, old, new
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
