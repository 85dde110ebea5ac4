"""The profile that produced gluon_causal_profile_*.txt: flash2's causal bf16 forward + backward at
D = 64, Gluon and Triton kernels, their CUDA times (torch.profiler, ten calls), the host time of a
backward call, and at N = 1024 the host's hot spots (cProfile). Run with PYTHONPATH at the repo root."""

import time
from functools import partial

import torch
from torch.profiler import ProfilerActivity, profile

from common.timing import cprofile_calls, top_functions
from tritonlab.attention.flash2 import flash_backward, flash_forward


def profile_one(B, N, impl):
    q, k, v, do = (torch.randn(B, N, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    o, lse = flash_forward(q, k, v, True, impl=impl)

    def step():
        flash_forward(q, k, v, True, impl=impl)
        flash_backward(q, k, v, o, lse, do, True, impl=impl)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    print(f"== B={B} N={N} impl={impl}")
    for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:6]:
        print(f"   {e.key[:60]:60s} {e.device_time_total / e.count / 1000:.4f} ms x{e.count}")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(50):
        flash_backward(q, k, v, o, lse, do, True, impl=impl)
    host = (time.perf_counter() - start) / 50
    torch.cuda.synchronize()
    print(f"   host+queue per backward call: {host * 1e3:.3f} ms")
    if N == 1024:
        call = partial(flash_backward, q, k, v, o, lse, do, True, impl=impl)
        print(top_functions(cprofile_calls(call, 100), "tottime", 12))


def main():
    for B, N in [(16, 16384), (64, 1024)]:
        for impl in ("gluon", "triton"):
            profile_one(B, N, impl)


if __name__ == "__main__":
    main()
