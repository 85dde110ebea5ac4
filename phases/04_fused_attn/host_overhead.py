"""Is a shape bound by the GPU or by the host? Device time against host time per forward + backward.

    python -m phases.04_fused_attn.host_overhead [--shape small]

For each implementation, three numbers per call:
* ``bench``: ``common.bench`` as the benchmark times it (L2 flushed before each call);
* ``device``: the GPU's time for 20 calls queued back to back -- a sleep kernel first keeps the
  GPU busy while the host queues them all, so no host gap falls between the two events;
* ``host``: the host's time to queue one call (Python, autograd, argument binding, launches).
When ``host`` exceeds ``device``, the GPU waits on the host and ``bench`` shows the host's time.
Printed only (exploration numbers for the notes); nothing is written to the CSVs.
"""

import argparse
import importlib
import time

import torch

from common import ON_GPU, bench, resolve_shape

from .fused import attention

benchmark = importlib.import_module("phases.02_attn_fwd.benchmark")
two_pass = importlib.import_module("phases.03_attn_bwd")
CALLS = 20


def device_and_host_ms(fn) -> tuple[float, float]:
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time: the host queues every call meanwhile
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for _ in range(CALLS):
        fn()
    host_ms = (time.perf_counter() - t0) * 1e3 / CALLS
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / CALLS, host_ms


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m phases.04_fused_attn.host_overhead")
    parser.add_argument("--shape", nargs="+", default=["small"])
    args = parser.parse_args(argv)
    if not ON_GPU:
        raise SystemExit("host_overhead: needs a CUDA GPU")
    variants = {"triton-fused": attention, "triton-2pass": two_pass.attention, **benchmark.sdpa_variants()}
    for name in args.shape:
        case = benchmark.tnp_case(resolve_shape(name))
        inputs = benchmark.make_inputs(case, benchmark.DTYPE, grad=True)
        for variant, fn in variants.items():

            def call(fn=fn, inputs=inputs):
                return benchmark.run_case(fn, *inputs, backward=True)

            call()  # compiles and autotunes
            timed = bench(call, warmup_ms=25.0, rep_ms=150.0)
            device_ms, host_ms = device_and_host_ms(call)
            print(
                f"{name:6s} {variant:14s} bench {timed.ms:8.4f} ms  device {device_ms:8.4f} ms  "
                f"host {host_ms:8.4f} ms per forward + backward"
            )


if __name__ == "__main__":
    main()
