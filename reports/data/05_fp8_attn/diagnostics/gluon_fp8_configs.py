"""The Gluon FP8 forward (``fp8_hopper``) at its tile widths and ring stages, kernel
time alone (the K/V quantisation launch included), beside the Triton FP8 forward, our bf16 Gluon
forward and SDPA cuDNN, at mid, large and mid-d128 (the model's strided layout). Each FP8 cell is
checked first: its output against cuDNN's (relative Frobenius error, within fp8.ERROR_BOUND).

    PYTHONPATH=. python3 reports/data/05_fp8_attn/diagnostics/gluon_fp8_configs.py
"""

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from common.attention_bench import make_inputs, tnp_case, with_head_dim
from tritonlab.attention import attention_forward, fp8, fp8_hopper
from tritonlab.attention._common import LOG2E
from tritonlab.attention.forward import _forward_outputs

# (BLOCK_N, STAGES) per head dim: what builds within Hopper's shared memory.
CONFIGS = {64: [(128, 3), (128, 2), (128, 4)], 128: [(64, 3), (64, 4), (128, 2)]}


def gluon_fp8(q, k, v, config):
    k8, ks, v8t, vs, vm = fp8._quantize_kv(k, v)
    o, lse = _forward_outputs(q)
    fp8_hopper.forward(
        q, k8, ks, v8t, vs, vm, o, lse, q.shape[-1] ** -0.5 * LOG2E, fp8.KV_BLOCK, k.shape[2], config
    )
    return o


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main():
    for name, d in (("mid", 64), ("large", 64), ("mid", 128)):
        case = with_head_dim(tnp_case(name), d)
        q, k, v = make_inputs(case, torch.bfloat16, grad=False)[:3]
        reps = dict(warmup=25, rep=100) if name == "mid" else dict(warmup=1, rep=5)
        flops = 4 * case.batch * case.heads * case.lq * case.lk * d
        ref = cudnn(q, k, v)
        base = do_bench(functools.partial(cudnn, q, k, v), **reps)
        print(f"{case.label} sdpa-cudnn {base:.3f} ms ({flops / base / 1e9:.0f} TFLOP/s)", flush=True)
        others = {
            "bf16 gluon": functools.partial(attention_forward, q, k, v),
            "fp8 triton": functools.partial(fp8.fp8_attention_forward, q, k, v, impl="triton"),
        }
        for label, fn in others.items():
            ms = do_bench(fn, **reps)
            print(
                f"{case.label} {label}: {ms:.3f} ms ({base / ms:.3f}x cuDNN), rel {rel(fn()[0], ref):.1e}",
                flush=True,
            )
        for config in CONFIGS[d]:
            tag = f"{case.label} fp8 gluon (BLOCK_N, stages)={config}"
            try:
                err = rel(gluon_fp8(q, k, v, config), ref)
                assert err < fp8.ERROR_BOUND, err
                ms = do_bench(functools.partial(gluon_fp8, q, k, v, config), **reps)
                print(
                    f"{tag}: {ms:.3f} ms ({base / ms:.3f}x cuDNN, {flops / ms / 1e9:.0f} TFLOP/s), rel {err:.1e}",
                    flush=True,
                )
            except Exception as exc:  # a config that does not build or fit is a line, not the end
                print(f"{tag}: {type(exc).__name__} {exc}"[:300], flush=True)


if __name__ == "__main__":
    main()
