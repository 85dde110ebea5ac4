"""How low the host time of one attention forward + backward can go at the TransformerNP's small
shape, where the plain call is bound by the host: SDPA cuDNN's call, ours, and two floors of a
Python ``torch.autograd.Function`` with ours' inputs and outputs -- the same allocations and two
launches of an empty compiled kernel, then the allocations alone -- beside the host time of each
piece of our call path on its own. Host microseconds a call, the GPU not waited for, median of
``ROUNDS`` rounds of ``CALLS`` calls.

    PYTHONPATH=. python3 reports/data/04_fused_attn/diagnostics/host_floor.py
"""

import gc
import statistics
import time
from functools import partial

import torch
import triton

from common.attention_bench import make_inputs, run_case, sdpa_variants, tnp_case
from tritonlab._launch import LaunchCache, first_launch, launch, signature_key
from tritonlab.attention import backward, forward_hopper, fused, fused_attention
from tritonlab.attention._common import check_qkv, softmax_scale
from tritonlab.attention.forward import _forward_outputs

CALLS, ROUNDS = 300, 7
SCALE = 0.125  # 1/sqrt(64)


@triton.jit
def _empty_kernel(X):
    pass


_EMPTY = LaunchCache(first_launch)


def _launch_empty(t: torch.Tensor) -> None:
    launch(_EMPTY, _empty_kernel, (1,), (t,), (), {})


class _Floor(torch.autograd.Function):
    """Ours' outputs and buffers, each half either computing nothing (its allocations, and with
    ``launches`` an empty kernel) or running our real code (``real``: "fwd", "bwd", "both"), so that
    the host time between the floor and our call can be split between the two halves."""

    @staticmethod
    def forward(ctx, q, k, v, launches, real):
        if real in ("fwd", "both"):
            o, lse = backward._checked_forward(q, k, v, SCALE)
        else:
            o, lse = _forward_outputs(q)
            if launches:
                _launch_empty(o)
        ctx.launches, ctx.real = launches, real
        ctx.save_for_backward(q, k, v, o, lse)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        if ctx.real in ("bwd", "both"):
            dq, grads = fused._fused_backward(q, k, v, o, lse, do, SCALE)
        else:
            dq = backward._like_q_layout(q)
            grads, _ = backward._key_grad_buffers(k, 1)
            if ctx.launches:
                _launch_empty(grads)
        return dq, grads[0], grads[1], None, None


class _Timeline(torch.autograd.Function):
    """The floor's forward; a backward that stamps the host clock on entry, around its launch or our
    backward, and on exit, into the ``stamps`` list its forward was given."""

    @staticmethod
    def forward(ctx, q, k, v, what, stamps):
        o, lse = _forward_outputs(q)
        ctx.what, ctx.stamps = what, stamps
        ctx.save_for_backward(q, k, v, o, lse)
        return o

    @staticmethod
    def backward(ctx, do):
        t1 = time.perf_counter()
        q, k, v, o, lse = ctx.saved_tensors
        if ctx.what == "ours":
            t2 = time.perf_counter()
            dq, grads = fused._fused_backward(q, k, v, o, lse, do, SCALE)
        else:
            dq = backward._like_q_layout(q)
            grads, _ = backward._key_grad_buffers(k, 1)
            t2 = time.perf_counter()
            if ctx.what == "launch":
                _launch_empty(grads)
        t3 = time.perf_counter()
        ctx.stamps.append([t1, t2, t3])
        return dq, grads[0], grads[1], None, None


def timeline(what: str, q, k, v, do) -> str:
    """Medians (us) of: grad() entered -> backward entered, -> its launch or our backward starts,
    -> it returns, -> grad() returns."""
    spans = []
    for i in range(CALLS):
        stamps = []
        t0 = time.perf_counter()
        o = _Timeline.apply(q, k, v, what, stamps)
        ta = time.perf_counter()
        torch.autograd.grad(o, (q, k, v), do)
        t4 = time.perf_counter()
        t1, t2, t3 = stamps[0]
        if i >= 20:
            spans.append((ta - t0, t1 - ta, t2 - t1, t3 - t2, t4 - t3))
        if i % 50 == 0:
            torch.cuda.synchronize()
    med = [statistics.median(col) * 1e6 for col in zip(*spans, strict=True)]
    return (
        "forward {:.1f}, to backward {:.1f}, its allocations {:.1f}, launch/ours {:.1f}, back {:.1f}".format(
            *med
        )
    )


def floor(launches: bool, real: str | None = None):
    return lambda q, k, v: _Floor.apply(q, k, v, launches, real)


def host_us(call) -> float:
    """Median over rounds of the host's microseconds a call."""
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(CALLS):
            call()
        rounds.append((time.perf_counter() - start) * 1e6 / CALLS)
        torch.cuda.synchronize()
    return statistics.median(rounds)


def main() -> None:
    q, k, v, do = make_inputs(tnp_case("small"), torch.bfloat16, grad=True)
    print(
        f"# {torch.cuda.get_device_name()}, small: q {tuple(q.shape)}, k {tuple(k.shape)}, bf16", flush=True
    )
    whole = {
        "sdpa-cudnn fwd+bwd": partial(run_case, sdpa_variants()["sdpa-cudnn"], q, k, v, do, True),
        "ours fwd+bwd (fused_attention)": partial(run_case, fused_attention, q, k, v, do, True),
        "ours fwd alone": partial(run_case, fused_attention, q, k, v, do, False),
        "floor: Function, allocations, 2 empty launches": partial(run_case, floor(True), q, k, v, do, True),
        "floor: Function, allocations": partial(run_case, floor(False), q, k, v, do, True),
        "floor fwd alone": partial(run_case, floor(True), q, k, v, do, False),
        "floor, our forward": partial(run_case, floor(True, "fwd"), q, k, v, do, True),
        "floor, our backward": partial(run_case, floor(True, "bwd"), q, k, v, do, True),
        "floor, ours both": partial(run_case, floor(True, "both"), q, k, v, do, True),
    }
    for name, call in whole.items():
        print(f"{name:48s} {host_us(call):7.1f} us", flush=True)
    gc.disable()  # whether the collector's passes over more Python objects explain any of it
    print(f"{'ours fwd+bwd, gc disabled':48s} {host_us(whole['ours fwd+bwd (fused_attention)']):7.1f} us")
    gc.enable()
    for what in ("none", "launch", "ours"):
        print(f"timeline, backward {what:6s}: {timeline(what, q, k, v, do)} us", flush=True)
    scale = softmax_scale(q.shape[-1], None)
    assert scale == SCALE
    with torch.no_grad():
        o, lse = backward._checked_forward(q, k, v, scale)
    pieces = {
        "check_qkv": partial(check_qkv, q, k, v, ndim=4),
        "softmax_scale": partial(softmax_scale, q.shape[-1], None),
        "forward_hopper.unsupported_reason": partial(forward_hopper.unsupported_reason, q, k, v),
        "signature_key(q, k, v)": partial(signature_key, q, k, v),
        "_forward_outputs (2 allocations)": partial(_forward_outputs, q),
        "backward._uses_gluon": partial(backward._uses_gluon, q, k, v, do),
        "torch.empty": partial(torch.empty, (64, 8), device="cuda"),
        "empty launch through launch()": partial(_launch_empty, q),
        "ours forward, checked (_checked_forward)": partial(backward._checked_forward, q, k, v, scale),
        "ours backward (fused._fused_backward)": partial(fused._fused_backward, q, k, v, o, lse, do, scale),
        "fused._deterministic_fused_backward": partial(
            fused._deterministic_fused_backward, q, k, v, o, lse, do, scale
        ),
        "signature_key(q, k, v, o, do)": partial(signature_key, q, k, v, o, do),
        "_key_grad_buffers + _like_q_layout": lambda: (
            backward._key_grad_buffers(k, 1),
            backward._like_q_layout(q),
        ),
    }
    for name, call in pieces.items():
        print(f"  {name:46s} {host_us(call):7.1f} us", flush=True)


if __name__ == "__main__":
    main()
