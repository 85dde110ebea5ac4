"""Attention alone on the TransformerNP's own layouts: q (B, H, M+N, D) a view of one (B, L, H*D)
projection, k and v views of one (B, M, 2, H, D) projection. Forward and forward + backward of SDPA
cuDNN, fused_attention and fp8_attention, eager and inside torch.compile(fullgraph=True), at mid;
which configs the eager calls picked. Explains whether FP8 attention's phase-05 gain reaches the model.

    PYTHONPATH=. python3 reports/data/12_matrix/diagnostics/attention_in_model.py [mid|large]
"""

import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from tritonlab.attention import fp8_attention, fused_attention
from tritonlab.models.shapes import SHAPES
from tritonlab.tuning import ConfigRecord

H, D = 8, 64


def model_layout(shape):
    B, M, L = shape.batch, shape.m_context, shape.m_context + shape.n_target
    q_base = torch.randn(B, L, H * D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    kv_base = torch.randn(B, M, 2 * H * D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    return q_base, kv_base


def split(q_base, kv_base):
    B, L, _ = q_base.shape
    M = kv_base.shape[1]
    q = q_base.view(B, L, H, D).transpose(1, 2)
    kv = kv_base.view(B, M, 2, H, D)
    return q, kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v)


def fp8(q, k, v, **kw):
    return fp8_attention(q, k, v, force_fp8=True, **kw)


def time_one(attend, q_base, kv_base, do):
    fwd = do_bench(lambda: attend(q_base, kv_base), warmup=50, rep=300)

    def step():
        q_base.grad = kv_base.grad = None
        attend(q_base, kv_base).backward(do)

    return fwd, do_bench(step, warmup=50, rep=300)


def main():
    shape = SHAPES[sys.argv[1] if len(sys.argv) > 1 else "mid"]
    q_base, kv_base = model_layout(shape)
    L = shape.m_context + shape.n_target
    do = torch.randn(shape.batch, H, L, D, device="cuda", dtype=torch.bfloat16)
    q, k, _ = split(q_base, kv_base)
    print(f"{shape.label()}: q strides {tuple(q.stride())}, k strides {tuple(k.stride())}")
    for name, fn in (("fused", fused_attention), ("fp8", fp8)):
        record = ConfigRecord()
        fn(*split(q_base, kv_base), record=record).backward(do)
        print(f"  {name} eager picked: {record.picked}")
    for mode in ("eager", "compile"):
        for name, fn in (("cudnn", cudnn), ("fused", fused_attention), ("fp8", fp8)):

            def attend(qb, kb, f=fn):
                return f(*split(qb, kb))

            if mode == "compile":
                attend = torch.compile(attend, fullgraph=True)
            fwd, both = time_one(attend, q_base, kv_base, do)
            print(f"  {mode:8s} {name:6s} fwd {fwd:8.3f} ms   fwd+bwd {both:8.3f} ms")


if __name__ == "__main__":
    main()
