"""Where the host time of small calls goes: per call, the CPU time of a loop that never waits for the
GPU, the Python functions that take it (cProfile, by own time) and the CUDA runtime calls among it
(torch.profiler's CPU side: launches, allocations, synchronisations).

    PYTHONPATH=. python3 reports/data/kernel_suite/diagnostics/host_profile.py [case ...]
"""

import sys
import time

import torch
import torch.nn.functional as F

from common.attention_bench import make_inputs, tnp_case
from common.timing import cprofile_calls, top_functions
from tritonlab import ops
from tritonlab.attention import attention, fused_attention

DEV = "cuda"
BF16 = torch.bfloat16


def _grad(outs, inputs, grads):
    return torch.autograd.grad(outs, inputs, grads)


def rms_norm_case(fn):
    x = torch.randn(4096, 1024, device=DEV, dtype=BF16, requires_grad=True)
    w = torch.randn(1024, device=DEV, dtype=BF16, requires_grad=True)
    dy = torch.randn_like(x)
    return lambda: _grad(fn(x, w), (x, w), dy)


def ce_case(**options):
    check = options.pop("check_targets", True)
    logits = torch.randn(4096, 32000, device=DEV, dtype=BF16, requires_grad=True)
    target = torch.randint(0, 32000, (4096,), device=DEV)

    def call():
        loss = ops.cross_entropy(logits, target, check_targets=check, **options)
        return _grad(loss, logits, None)

    return call


def ce_eager_case():
    logits = torch.randn(4096, 32000, device=DEV, dtype=BF16, requires_grad=True)
    target = torch.randint(0, 32000, (4096,), device=DEV)
    return lambda: _grad(F.cross_entropy(logits, target), logits, None)


def geglu_case(fn):
    gate = torch.randn(4096, 1024, device=DEV, dtype=BF16, requires_grad=True)
    up = torch.randn_like(gate, requires_grad=True)
    dy = torch.randn_like(gate)
    return lambda: _grad(fn(gate, up), (gate, up), dy)


def attention_case(fn):
    q, k, v, do = make_inputs(tnp_case("small"), BF16, grad=True)
    return lambda: _grad(fn(q, k, v), (q, k, v), do)


def sdpa_cudnn(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v)


CASES = {
    "rms_norm": lambda: rms_norm_case(ops.rms_norm),
    "rms_norm-eager": lambda: rms_norm_case(lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6)),
    "ce": lambda: ce_case(),
    "ce-unchecked": lambda: ce_case(check_targets=False),
    "ce-options": lambda: ce_case(label_smoothing=0.1, softcap=30.0, lse_square_scale=1e-4),
    "ce-options-unchecked": lambda: ce_case(
        label_smoothing=0.1, softcap=30.0, lse_square_scale=1e-4, check_targets=False
    ),
    "ce-eager": ce_eager_case,
    "geglu": lambda: geglu_case(ops.geglu),
    "geglu-eager": lambda: geglu_case(lambda g, u: F.gelu(g, approximate="tanh") * u),
    "attn-2pass-small": lambda: attention_case(attention),
    "attn-fused-small": lambda: attention_case(fused_attention),
    "attn-cudnn-small": lambda: attention_case(sdpa_cudnn),
}


def host_ms(fn, calls=200):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) * 1e3 / calls
    torch.cuda.synchronize()
    gpu = (time.perf_counter() - start) * 1e3 / calls
    return host, gpu


def main(names):
    for name in names:
        fn = CASES[name]()
        for _ in range(20):
            fn()
        host, wall = host_ms(fn)
        print(f"\n===== {name}: host {host * 1e3:.1f} us per call, wall (loop + sync) {wall * 1e3:.1f} us")
        print(top_functions(cprofile_calls(fn, 200), "tottime", 22)[:6000])
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
            for _ in range(50):
                fn()
            torch.cuda.synchronize()
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60))


if __name__ == "__main__":
    main(sys.argv[1:] or list(CASES))
