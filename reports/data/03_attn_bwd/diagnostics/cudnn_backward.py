"""Our forward's (o, lse) into cuDNN's attention backward (aten::_scaled_dot_product_cudnn_attention_backward):
does cuDNN accept them, do the gradients match cuDNN's own, and what does the pairing cost, at mid
and large (H100, bf16, the model's layout). Output: cudnn_backward_<commit>.txt."""

import torch
import triton

from tritonlab.attention import attention, attention_forward
from tritonlab.testing import model_qkv

aten = torch.ops.aten


def measure(name, B, H, Lq, Lk, D):
    q, k, v = model_qkv(B, H, Lq, Lk, D, dtype=torch.bfloat16, device="cuda")
    outs = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, False, False)
    o_c, lse_c = outs[0], outs[1]
    print(
        name,
        "cudnn out",
        o_c.shape,
        o_c.stride(),
        "lse",
        lse_c.shape,
        lse_c.stride(),
        lse_c.dtype,
        len(outs),
        flush=True,
    )
    o, lse = attention_forward(q, k, v)
    print(
        name,
        "ours lse",
        lse.shape,
        lse.stride(),
        "max |lse - lse_c|",
        (lse - lse_c.reshape(lse.shape)).abs().max().item(),
        flush=True,
    )
    do = torch.randn_like(o_c)
    scale = D**-0.5
    bias = [None]

    def bwd(o_, lse_):
        return aten._scaled_dot_product_cudnn_attention_backward(
            do,
            q,
            k,
            v,
            o_,
            lse_,
            outs[6],
            outs[7],
            bias[0],
            outs[2],
            outs[3],
            Lq,
            Lk,
            0.0,
            False,
            scale=scale,
        )

    try:
        bwd(o_c, lse_c)
    except Exception as e:  # noqa: BLE001
        print(name, "bias None failed:", str(e)[:200], flush=True)
        bias[0] = torch.empty(0, device="cuda", dtype=q.dtype)
    g_ref = bwd(o_c, lse_c)
    try:
        g_mix = bwd(o, lse.reshape(lse_c.shape))
        for n, a, b in zip("qkv", g_mix, g_ref, strict=True):
            rel = ((a.float() - b.float()).norm() / b.float().norm()).item()
            print(name, f"d{n} rel diff ours-fwd->cudnn-bwd vs cudnn {rel:.2e}", flush=True)
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        t_cudnn_bwd = triton.testing.do_bench(lambda: bwd(o_c, lse_c), warmup=25, rep=200)
        t_ours = triton.testing.do_bench(lambda: attention(qg, kg, vg).backward(do), warmup=25, rep=200)
        t_fwd = triton.testing.do_bench(lambda: attention_forward(q, k, v), warmup=25, rep=200)
        t_cfwd = triton.testing.do_bench(
            lambda: aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, False, False),
            warmup=25,
            rep=200,
        )
        print(
            name,
            f"cudnn fwd {t_cfwd:.3f} bwd {t_cudnn_bwd:.3f} | ours fwd {t_fwd:.3f} fwd+bwd {t_ours:.3f} | "
            f"mixed fwd+bwd ~{t_fwd + t_cudnn_bwd:.3f} vs cudnn {t_cfwd + t_cudnn_bwd:.3f}",
            flush=True,
        )
    except Exception as e:  # noqa: BLE001
        print(name, "mixed failed:", type(e).__name__, str(e)[:500], flush=True)


for name, shape in {"mid": (4, 8, 11000, 10000, 64), "large": (1, 8, 205000, 200000, 64)}.items():
    measure(name, *shape)
