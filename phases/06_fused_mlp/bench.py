"""Forward, backward and forward+backward of one differentiable function: times, memory, error.

Phases 06-08 measure every variant the same way, side by side in one run:
- correctness first: output and input gradients against a float32 eager reference of the same
  inputs (relative Frobenius error; bf16 lands near 1e-2 at most),
- forward: ``fn(*inputs)`` with autograd recording, as in training;
- backward: ``autograd.grad`` of one kept output (``retain_graph``, so the same graph is reused);
- forward+backward: both, the number that matters for a training step;
- memory: what the forward keeps alive for the backward (its saved tensors and the output), and
  the peak above the inputs during forward+backward.

torch.compile's backward normally frees ("donates") saved buffers as it goes, which forbids the
``retain_graph`` the backward timing needs; ``measure_fwd_bwd`` turns donation off, which can only
raise compile's peak memory a little, not change its times.
"""

from collections.abc import Callable

import torch
from torch import Tensor

from common import ON_GPU, bench, measure_peak_memory

BENCH = {"warmup_ms": 25.0, "rep_ms": 150.0} if ON_GPU else {"warmup_ms": 1.0, "rep_ms": 1.0, "min_reps": 1}


def rel_err(out: Tensor, ref: Tensor) -> float:
    out, ref = out.detach().double(), ref.detach().double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def check_against(fn: Callable, reference: Callable, inputs: list[Tensor], grad_out: Tensor) -> dict:
    """Relative errors of fn's output and input gradients vs ``reference`` on float32 copies of the inputs."""
    ref_inputs = [t.detach().float().requires_grad_(t.requires_grad) for t in inputs]
    ref_out = reference(*ref_inputs)
    ref_grads = torch.autograd.grad(ref_out, [t for t in ref_inputs if t.requires_grad], grad_out.float())
    out = fn(*inputs)
    grads = torch.autograd.grad(out, [t for t in inputs if t.requires_grad], grad_out)
    return {
        "err_out": rel_err(out, ref_out),
        "err_grad": max(rel_err(g, r) for g, r in zip(grads, ref_grads, strict=True)),
    }


def measure_fwd_bwd(fn: Callable, inputs: list[Tensor], grad_out: Tensor) -> dict:
    """Median ms of forward, backward and forward+backward, with the memory columns."""
    with torch._functorch.config.patch(donated_buffer=False):
        return _measure(fn, inputs, grad_out)


def _time_backward(out: Tensor, wrt: list[Tensor], grad_out: Tensor):
    """One forward's graph, backpropagated again and again; freed when this returns."""
    return bench(lambda: torch.autograd.grad(out, wrt, grad_out, retain_graph=True), **BENCH)


def _measure(fn: Callable, inputs: list[Tensor], grad_out: Tensor) -> dict:
    wrt = [t for t in inputs if t.requires_grad]

    def forward():
        return fn(*inputs)

    def forward_backward():
        torch.autograd.grad(forward(), wrt, grad_out)

    forward_backward()  # compilation and autotuning happen here, before any clock starts
    forward_backward()
    fwd = bench(forward, **BENCH)
    bwd = _time_backward(forward(), wrt, grad_out)
    step = bench(forward_backward, **BENCH)

    before = torch.cuda.memory_allocated() if ON_GPU else 0
    with measure_peak_memory() as mem:
        out = forward()
        kept = (torch.cuda.memory_allocated() if ON_GPU else 0) - before
        grads = torch.autograd.grad(out, wrt, grad_out)
    del out, grads
    return {
        "fwd_ms": fwd.ms,
        "bwd_ms": bwd.ms,
        "fwd_bwd_ms": step.ms,
        "fwd_bwd_p20_ms": step.p20_ms,
        "fwd_bwd_p80_ms": step.p80_ms,
        "reps": step.reps,
        "saved_mb": kept / 1e6,
        "peak_mb": max(mem.peak_bytes - before, 0) / 1e6,
    }
