"""The Gluon dK/dV kernel's configs (query tile, stages, registers of the second MMA warpgroup) against
the Triton dK/dV kernel: kernel times from torch.profiler (ten calls each), dK and dV checked against the
Triton kernels' (relative Frobenius error). Heads folded into the batch (flash2's layout)."""

import torch
from torch.profiler import ProfilerActivity, profile

from tritonlab.attention import backward_hopper
from tritonlab.attention._common import backward_delta
from tritonlab.attention.flash2 import flash_backward, flash_forward

SHAPES = [  # (name, B, Lq, Lk, D, causal)
    ("odd", 3, 1000, 1025, 64, True),
    ("odd d128", 3, 1025, 1000, 128, False),
    ("flash2 goal", 16, 16384, 16384, 64, True),
    ("mid heads folded", 32, 11000, 10000, 64, False),
    ("flash2 d128", 8, 8192, 8192, 128, True),
    ("mid d128 heads folded", 32, 11000, 10000, 128, False),
]
CONFIGS = {
    64: [(64, 2, 168), (64, 2, 240), (64, 3, 240), (64, 3, 168)],
    128: [(32, 2, 240), (32, 3, 240), (64, 2, 240)],
}


def kernel_ms(fn, name):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    times = [e.device_time_total / e.count / 1000 for e in prof.key_averages() if e.key.startswith(name)]
    return times[0] if times else float("nan")


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def measure_shape(label, B, Lq, Lk, D, causal):
    torch.manual_seed(0)
    q = torch.randn(B, Lq, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, Lk, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    do = torch.randn_like(q)
    o, lse = flash_forward(q, k, v, causal, impl="triton")
    _, dk_ref, dv_ref = flash_backward(q, k, v, o, lse, do, causal, impl="triton")
    triton_ms = kernel_ms(
        lambda: flash_backward(q, k, v, o, lse, do, causal, impl="triton"), "_bwd_dkdv_kernel"
    )
    print(f"{label} B={B} Lq={Lq} Lk={Lk} D={D} causal={causal}: triton dkdv {triton_ms:.3f} ms", flush=True)
    delta = backward_delta(o, do)
    heads = [t.unsqueeze(1) for t in (q, k, v, lse, do, delta)]
    grads = torch.empty((2, B, 1, Lk, D), dtype=k.dtype, device=k.device)
    for config in CONFIGS[D]:

        def call(config=config):
            backward_hopper.dkdv(*heads, grads, D**-0.5, causal=causal, config=config)

        try:
            grads.fill_(float("nan"))  # what the kernel does not write stays NaN
            call()
            err = max(rel(grads[0, :, 0], dk_ref), rel(grads[1, :, 0], dv_ref))
            exact = sum(torch.equal(a, b) for a, b in ((grads[0, :, 0], dk_ref), (grads[1, :, 0], dv_ref)))
            ms = kernel_ms(call, "_dkdv_kernel")
            print(
                f"   gluon {config}: {ms:.3f} ms ({triton_ms / ms:.3f}x triton), err {err:.2e}, "
                f"bit-equal to triton: {exact} of 2, NaN left: {torch.isnan(grads).any().item()}",
                flush=True,
            )
        except Exception as e:  # a config that does not build or run: say so and go on
            print(f"   gluon {config}: failed: {type(e).__name__}: {str(e)[:200]}", flush=True)


def main():
    for shape in SHAPES:
        measure_shape(*shape)


if __name__ == "__main__":
    main()
