"""Where a flash2 forward call's host time goes, per kernel family, at a shape whose kernels are
short ((16, 4096, 64) causal bf16: ~0.1 ms of GPU work): the host's milliseconds per call beside the
kernels' (``common.timing.host_and_device_ms``), then a cProfile of 300 calls, top functions by own
time. The forward with grad enabled, as the benchmark's fwd cell calls it. Then the same for phase
02's ``attention_forward`` at the TransformerNP's small shape (64, 8, 500, 64), non-causal.

    PYTHONPATH=. python3 reports/data/flash2/diagnostics/forward_host.py
"""

import torch

from common.timing import cprofile_calls, host_and_device_ms, top_functions
from tritonlab.attention import FlashAttentionTriton, attention_forward

SHAPE = (16, 4096, 64)


def profile(name: str, call) -> None:
    for _ in range(20):
        call()
    host_ms, device_ms = host_and_device_ms(call, calls=200)
    print(f"{name:24s} host {host_ms * 1e3:7.1f} us a call, kernels {device_ms * 1e3:7.1f} us", flush=True)
    print(top_functions(cprofile_calls(call, 300), "tottime", 14)[:4000], flush=True)


def main() -> None:
    torch.manual_seed(0)
    make = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    q, k, v = (make(*SHAPE) for _ in range(3))
    print(f"# {torch.cuda.get_device_name()}, flash2 (B, N, D) = {SHAPE}, causal, bf16", flush=True)
    for impl in ("triton", "gluon", "auto"):
        profile(f"flash2 {impl}", lambda impl=impl: FlashAttentionTriton.apply(q, k, v, True, impl))
    q4, k4, v4 = (make(64, 8, 500, 64) for _ in range(3))
    profile("02 attention_forward", lambda: attention_forward(q4, k4, v4))


if __name__ == "__main__":
    main()
