"""The Gluon FP8 forward (tritonlab/attention/fp8_hopper.py) on the GPU: float64 checks at odd
shapes, then its (BLOCK_N, STAGES) candidates against the Triton FP8 kernel, our bf16 forward and
SDPA cuDNN at mid and large, the model's strided layout, side by side in one process."""

import sys

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from tritonlab.attention import attention_forward, fp8, fp8_attention_forward, fp8_hopper, reference_attention
from tritonlab.testing import model_qkv, rel_err


def bench(fn):
    return triton.testing.do_bench(fn, warmup=100, rep=500)


def tflops(B, H, Lq, Lk, D, ms):
    return 4 * B * H * Lq * Lk * D / ms / 1e9


for D in (64, 128):
    for Lq, Lk in [(1, 1), (17, 17), (100, 257), (257, 100), (1000, 1000), (193, 3000)]:
        q, k, v = model_qkv(2, 3, Lq, Lk, D, dtype=torch.bfloat16, device="cuda", seed=Lq + Lk)
        ref, ref_lse = reference_attention(q.double(), k.double(), v.double())
        for impl in ("gluon", "triton"):
            o, lse = fp8_attention_forward(q, k, v, impl=impl, force_fp8=True)
            err = rel_err(o.double(), ref)
            lse_err = (lse.double() - ref_lse).abs().max().item()
            ok = err <= fp8.ERROR_BOUND and lse_err <= fp8.LSE_BOUND and torch.isfinite(o).all().item()
            print(f"check D{D} Lq{Lq} Lk{Lk} {impl}: frob {err:.4f} lse {lse_err:.4f} {'ok' if ok else 'FAIL'}", flush=True)

shapes = {"mid": (4, 8, 11000, 10000, 64), "large": (1, 8, 205000, 200000, 64), "mid-d128": (4, 4, 11000, 10000, 128)}
candidates = {64: [(128, 3), (128, 2), (64, 3), (64, 4)], 128: [(128, 2), (64, 2), (64, 3)]}
for name in sys.argv[1:] or ["mid", "mid-d128", "large"]:
    B, H, Lq, Lk, D = shapes[name]
    q, k, v = model_qkv(B, H, Lq, Lk, D, dtype=torch.bfloat16, device="cuda")
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = F.scaled_dot_product_attention(q, k, v)
        res = {"cudnn": bench(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v))}
    res["bf16"] = bench(lambda q=q, k=k, v=v: attention_forward(q, k, v))
    o, _ = fp8_attention_forward(q, k, v, impl="triton")
    print(f"{name} triton-fp8 frob vs cudnn {rel_err(o.float(), ref.float()):.4f}", flush=True)
    res["fp8-triton"] = bench(lambda q=q, k=k, v=v: fp8_attention_forward(q, k, v, impl="triton"))
    for cfg in candidates[D]:
        fp8_hopper.CONFIGS[D] = cfg
        o, _ = fp8_attention_forward(q, k, v, impl="gluon")
        print(f"{name} gluon {cfg} frob vs cudnn {rel_err(o.float(), ref.float()):.4f}", flush=True)
        res[f"gluon{cfg}"] = bench(lambda q=q, k=k, v=v: fp8_attention_forward(q, k, v, impl="gluon"))
    res["quantize_kv"] = bench(lambda k=k, v=v: fp8._quantize_kv(k, v, key_order=True))
    print(
        f"speed {name}: "
        + " ".join(
            f"{n}={t:.3f}ms({tflops(B, H, Lq, Lk, D, t):.0f}TF,{res['cudnn'] / t:.3f}xcudnn,{res['bf16'] / t:.3f}xbf16)"
            for n, t in res.items()
        ),
        flush=True,
    )
