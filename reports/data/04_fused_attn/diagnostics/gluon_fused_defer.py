"""The fused backward with its dQ products deferred by a tile (``defer``: an owned tile's dQ is
issued with the next, given tile's dK, so the owner never waits for the other warpgroup's dS of
the same tile) against the products in the tile itself, kernel time alone (H100, bf16), at ring
stages x dQ staging tiles, beside the two-pass backward, at mid and large (D = 64, the model's
strided layout) and flash2's causal goal shape (16, 16384, 64). Each cell is checked against the
two-pass gradients first.

    PYTHONPATH=. python3 reports/data/04_fused_attn/diagnostics/gluon_fused_defer.py
"""

import functools

import torch
from triton.testing import do_bench

from common.attention_bench import make_inputs, tnp_case, with_head_dim
from tritonlab.attention import attention_forward, backward_hopper
from tritonlab.attention._common import backward_delta
from tritonlab.attention.backward import _key_grad_buffers, _like_q_layout, _two_pass_backward
from tritonlab.attention.flash2 import flash_backward, flash_forward


def fused(q, k, v, o, lse, do, scale, causal, **launch):
    B, H, Lq, D = q.shape
    delta = backward_delta(o, do)
    grads, _ = _key_grad_buffers(k, n_chunks=1)
    dq_sum = torch.zeros((B, H, Lq, D), dtype=torch.float32, device=q.device)
    backward_hopper.dkdv(q, k, v, lse, do, delta, grads, scale, causal=causal, dq=dq_sum, **launch)
    dq = _like_q_layout(q)
    dq.copy_(dq_sum)
    return dq, grads


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def cases():
    for name, d in (("mid", 64), ("large", 64)):
        case = with_head_dim(tnp_case(name), d)
        q, k, v, do = make_inputs(case, torch.bfloat16, grad=False)
        scale = d**-0.5
        o, lse = attention_forward(q, k, v)
        two_pass = functools.partial(_two_pass_backward, q, k, v, o, lse, do, scale)
        yield case.label, d, (q, k, v, o, lse, do, scale, False), two_pass, name == "mid"
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (
        torch.randn(16, 16384, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4)
    )
    o, lse = flash_forward(q, k, v, True)
    two_pass = functools.partial(flash_backward, q, k, v, o, lse, do, True, deterministic=True)
    heads = [t.unsqueeze(1) for t in (q, k, v, o)] + [lse.unsqueeze(1), do.unsqueeze(1)]
    yield "flash2-causal(16,16384,64)", 64, (*heads, 64**-0.5, True), two_pass, True


def main():
    for label, d, args, two_pass, short in cases():
        reps = dict(warmup=25, rep=100) if short else dict(warmup=1, rep=3)
        ref = two_pass()
        ref_dq, ref_kv = (ref[0], torch.stack(ref[1:])) if len(ref) == 3 else ref
        base = do_bench(two_pass, **reps)
        print(f"{label} two-pass backward {base:.3f} ms", flush=True)
        block_m, _, regs, _ = backward_hopper.FUSED_CONFIGS[d]
        for defer in (False, True):
            for stages in (2, 3):
                for dq_stages in (1, 2):
                    launch = dict(config=(block_m, stages, regs), dq_stages=dq_stages, defer=defer)
                    tag = f"{label} fused defer={defer} stages={stages} dq_stages={dq_stages}"
                    try:
                        dq, kv = fused(*args, **launch)
                        kv = kv.reshape(ref_kv.shape)
                        err = max(rel(dq.reshape(ref_dq.shape), ref_dq), rel(kv, ref_kv))
                        ms = do_bench(functools.partial(fused, *args, **launch), **reps)
                        print(
                            f"{tag}: {ms:.3f} ms ({base / ms:.3f}x two-pass), rel diff {err:.1e}", flush=True
                        )
                    except Exception as exc:  # a config that does not fit is a line, not the end
                        print(f"{tag}: {type(exc).__name__} {exc}"[:300], flush=True)


if __name__ == "__main__":
    main()
