import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from tritonlab.attention import attention_forward
from tritonlab.testing import model_qkv


def bench(fn):
    return triton.testing.do_bench(fn, warmup=50, rep=300)


for B, Lq, Lk in [
    (64, 564, 64),
    (200, 280, 256),
    (100, 564, 512),
    (200, 1100, 1000),
    (100, 2200, 2000),
    (67, 3300, 3000),
]:
    for D in (64, 128):
        H = 8 if D == 64 else 4
        q, k, v = model_qkv(B, H, Lq, Lk, D, dtype=torch.bfloat16, device="cuda")
        res = {}
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            res["cudnn"] = bench(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v))
        for impl in ("gluon", "tma", "auto"):
            attention_forward(q, k, v, impl=impl)
            res[impl] = bench(lambda q=q, k=k, v=v, impl=impl: attention_forward(q, k, v, impl=impl))
        print(
            f"thresh B{B} Lq{Lq} Lk{Lk} D{D}: "
            + " ".join(f"{n}={t * 1000:.1f}us({res['cudnn'] / t:.3f}x)" for n, t in res.items()),
            flush=True,
        )
