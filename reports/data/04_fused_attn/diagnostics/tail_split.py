"""The fused backward's split tail on Hopper: the last wave's key blocks (where they fill at most
half the SMs) run as query chunks in a launch of their own, their dK, dV summed in float32, against
the same backward without the split (``tail=(0, 1)``), in alternating rounds -- the Gluon dK/dV + dQ
launch alone, then the whole fused backward and forward + backward beside SDPA cuDNN. Mid, at the
model's strided layout.

    PYTHONPATH=. python3 reports/data/04_fused_attn/diagnostics/tail_split.py
"""

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from common.attention_bench import make_inputs, tnp_case
from tritonlab._runtime import cdiv, sm_count
from tritonlab.attention import backward_hopper, fused_attention
from tritonlab.attention._common import backward_delta
from tritonlab.attention.backward import _key_grad_buffers
from tritonlab.attention.forward import attention_forward


def kernel(q, k, v, lse, do, delta, scale, dq_sum, tail):
    grads, _ = _key_grad_buffers(k, n_chunks=1)
    backward_hopper.dkdv(q, k, v, lse, do, delta, grads, scale, dq=dq_sum, tail=tail)
    return grads


def fwd_bwd(q, k, v, do, tail):
    backward_hopper_dkdv = backward_hopper.dkdv
    backward_hopper.dkdv = functools.partial(backward_hopper_dkdv, tail=tail)
    try:
        o = fused_attention(q, k, v)
        return torch.autograd.grad(o, (q, k, v), do)
    finally:
        backward_hopper.dkdv = backward_hopper_dkdv


def cudnn(q, k, v, do):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = F.scaled_dot_product_attention(q, k, v)
    return torch.autograd.grad(o, (q, k, v), do)


def main():
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    q, k, v, do = make_inputs(tnp_case("mid"), torch.bfloat16, grad=True)
    B, H, Lq, D = q.shape
    block_m = backward_hopper.launch_config(D, fused=True)[0]
    programs = cdiv(k.shape[2], 128) * B * H
    auto = backward_hopper.tail_split(programs, sm_count(q.device), cdiv(Lq, block_m))
    print(f"mid: q {tuple(q.shape)}, k {tuple(k.shape)}; {programs} key blocks; tail_split -> {auto}")
    scale = D**-0.5
    with torch.no_grad():
        o, lse = attention_forward(q, k, v, scale)
        delta = backward_delta(o, do)
    dq_sums = {t: torch.zeros((B, H, Lq, D), dtype=torch.float32, device=q.device) for t in (auto, (0, 1))}
    grads = {t: kernel(q, k, v, lse, do, delta, scale, dq_sums[t], t) for t in (auto, (0, 1))}
    diff = max(
        ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
        for a, b in ((grads[auto], grads[(0, 1)]), (dq_sums[auto], dq_sums[(0, 1)]))
    )
    print(f"  split vs whole: max rel diff of dK, dV, dQ {diff:.3g}", flush=True)
    reps = dict(warmup=10, rep=100)
    calls = {
        "kernel split": functools.partial(kernel, q, k, v, lse, do, delta, scale, dq_sums[auto], auto),
        "kernel whole": functools.partial(kernel, q, k, v, lse, do, delta, scale, dq_sums[(0, 1)], (0, 1)),
    }
    for r in range(4):
        t = {
            label: do_bench(call, **reps)
            for label, call in (calls if r % 2 == 0 else dict(reversed(calls.items()))).items()
        }
        print(f"kernel round {r}: split {t['kernel split']:.3f} ms, whole {t['kernel whole']:.3f} ms;"
              f" split / whole {t['kernel split'] / t['kernel whole']:.4f}", flush=True)  # fmt: skip
    calls = {
        "cudnn": functools.partial(cudnn, q, k, v, do),
        "split": functools.partial(fwd_bwd, q, k, v, do, None),
        "whole": functools.partial(fwd_bwd, q, k, v, do, (0, 1)),
    }
    for r in range(4):
        t = {
            label: do_bench(call, **reps)
            for label, call in (calls if r % 2 == 0 else dict(reversed(calls.items()))).items()
        }
        print(f"fwd+bwd round {r}: cudnn {t['cudnn']:.3f} ms, split {t['split']:.3f} ({t['cudnn'] / t['split']:.3f}x),"
              f" whole {t['whole']:.3f} ({t['cudnn'] / t['whole']:.3f}x); split / whole {t['split'] / t['whole']:.4f}",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
