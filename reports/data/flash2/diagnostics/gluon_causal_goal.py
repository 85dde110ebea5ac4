"""The goal-shape check that produced gluon_causal_goal_*.txt: flash2's default call ("auto": the
Gluon kernels on Hopper), the Triton kernels pinned and SDPA cuDNN, relative errors against SDPA
cuDNN, then do_bench medians of fwd / bwd / fwd+bwd (bf16). Run with PYTHONPATH at the repo root."""

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from tritonlab.attention.flash2 import FlashAttentionTriton

SHAPES = [
    (16, 16384, 64, True),
    (8, 8192, 128, True),
    (4, 16384, 64, False),
    (64, 1024, 64, True),
    (256, 256, 64, True),
]


def sdpa(q, k, v, causal):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], is_causal=causal)[:, 0]


def impls(q, k, v, causal):
    return {
        "gluon": lambda: FlashAttentionTriton.apply(q, k, v, causal, "auto"),
        "triton": lambda: FlashAttentionTriton.apply(q, k, v, causal, "triton"),
        "cudnn": lambda: sdpa(q, k, v, causal),
    }


def measure(fn, q, k, v, do, want):
    o = fn()
    grads = torch.autograd.grad(o, (q, k, v), do)
    err = max(
        ((a.float() - b.float()).norm() / b.float().norm()).item()
        for a, b in zip((o, *grads), want, strict=True)
    )
    fwd = triton.testing.do_bench(fn, warmup=25, rep=200)
    o = fn()
    bwd = triton.testing.do_bench(
        lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), warmup=25, rep=200
    )
    both = triton.testing.do_bench(lambda: torch.autograd.grad(fn(), (q, k, v), do), warmup=25, rep=200)
    return err, (fwd, bwd, both)


def main():
    for B, N, D, causal in SHAPES:
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(B, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        for t in (q, k, v):
            t.requires_grad_()
        o_ref = sdpa(q, k, v, causal)
        want = (o_ref, *torch.autograd.grad(o_ref, (q, k, v), do))
        res = {}
        for name, fn in impls(q, k, v, causal).items():
            err, res[name] = measure(fn, q, k, v, do, want)
            fwd, bwd, both = res[name]
            print(
                f"B={B} N={N} D={D} causal={causal} {name:7s} err={err:.2e} fwd={fwd:.3f} bwd={bwd:.3f} "
                f"fwd+bwd={both:.3f} ms",
                flush=True,
            )
        c, g, t = res["cudnn"], res["gluon"], res["triton"]
        print(
            f"  ratio vs cudnn (gluon): fwd {c[0] / g[0]:.3f} bwd {c[1] / g[1]:.3f} fwd+bwd {c[2] / g[2]:.3f}; "
            f"triton-only fwd+bwd {c[2] / t[2]:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
