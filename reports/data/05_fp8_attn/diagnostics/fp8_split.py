"""The Gluon FP8 forward's split tail: the last wave's query blocks (where they fill at most half the
SMs) run as programs over key chunks, merged by ``combine_parts``, against the same forward without
the split (``tail=(0, 1)``), in alternating rounds beside SDPA cuDNN and our bf16 forward. Logs
before ``fp8_split_<commit>`` of a commit after 7318155 timed a one-launch split, since dropped. Each FP8 call includes its K/V quantisation launch, as ``fp8_attention_forward``'s
does. Mid (1 856 query blocks: 14 waves and 8 blocks on 132 SMs), at the model's strided layout.

    PYTHONPATH=. python3 reports/data/05_fp8_attn/diagnostics/fp8_split.py
"""

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from common.attention_bench import make_inputs, tnp_case
from tritonlab._runtime import cdiv, sm_count
from tritonlab.attention import attention_forward, fp8_hopper
from tritonlab.attention import fp8 as fp8_module
from tritonlab.attention._common import LOG2E, tail_split
from tritonlab.attention.fp8 import KV_BLOCK


def fp8_forward(q, k, v, tail):
    o, lse = fp8_module._forward_outputs(q)
    quantized = fp8_module._quantize_kv(k, v)
    fp8_hopper.forward(q, *quantized, o, lse, q.shape[-1] ** -0.5 * LOG2E, KV_BLOCK, k.shape[2], tail=tail)
    return o, lse


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v)


def main():
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    q, k, v = make_inputs(tnp_case("mid"), torch.bfloat16, grad=False)[:3]
    B, H, Lq, D = q.shape
    block_n = fp8_hopper.CONFIGS[D][0]
    programs = cdiv(Lq, fp8_hopper.BLOCK_M) * B * H
    auto = tail_split(programs, sm_count(q.device), cdiv(k.shape[2], block_n))
    (o, lse), (o0, lse0) = fp8_forward(q, k, v, auto), fp8_forward(q, k, v, (0, 1))
    diff = ((o.float() - o0.float()).abs().max() / o0.float().abs().max()).item()
    print(f"mid: q {tuple(q.shape)}, k {tuple(k.shape)}; {programs} query blocks; tail_split -> {auto}; "
          f"split vs whole: o max rel diff {diff:.3g}, lse max abs diff {(lse - lse0).abs().max().item():.3g}",
          flush=True)  # fmt: skip
    reps = dict(warmup=25, rep=150)
    calls = {
        "cudnn": functools.partial(cudnn, q, k, v),
        "bf16": functools.partial(attention_forward, q, k, v),
        "fp8 split": functools.partial(fp8_forward, q, k, v, auto),
        "fp8 whole": functools.partial(fp8_forward, q, k, v, (0, 1)),
    }
    for r in range(8):
        order = calls if r % 2 == 0 else dict(reversed(calls.items()))
        t = {label: do_bench(call, **reps) for label, call in order.items()}
        line = ", ".join(f"{label} {ms:.3f} ms ({t['cudnn'] / ms:.3f}x)" for label, ms in t.items())
        print(f"round {r}: {line}; split / whole {t['fp8 split'] / t['fp8 whole']:.4f}", flush=True)


if __name__ == "__main__":
    main()
