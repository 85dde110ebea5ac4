import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from tritonlab.attention import attention_forward, forward_hopper
from tritonlab.testing import model_qkv


def bench(fn):
    return triton.testing.do_bench(fn, warmup=100, rep=500)


for name, (B, H, Lq, Lk, D) in [("mid-d128", (4, 4, 11000, 10000, 128)), ("mid", (4, 8, 11000, 10000, 64))]:
    q, k, v = model_qkv(B, H, Lq, Lk, D, dtype=torch.bfloat16, device="cuda")
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        base = bench(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v))
    ref = F.scaled_dot_product_attention(q, k, v)
    cands = [(64, 2), (64, 3)] if D == 128 else [(128, 3), (128, 2)]
    for cfg in cands:
        forward_hopper.CONFIGS[D] = cfg
        forward_hopper._LAUNCHES.clear()
        o, _ = attention_forward(q, k, v, impl="gluon")
        err = (o.float() - ref.float()).abs().max().item()
        t = bench(lambda q=q, k=k, v=v: attention_forward(q, k, v, impl="gluon"))
        print(
            f"d128diag {name} BLOCK_N,STAGES={cfg}: {t:.3f} ms, cudnn {base:.3f} ms, {base / t:.3f}x, err {err:.2e}",
            flush=True,
        )
