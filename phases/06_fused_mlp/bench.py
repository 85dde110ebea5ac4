"""Forward, backward and forward+backward of one differentiable function: times, memory, error.

Phases 06-08 measure every variant the same way, side by side in one run:
- correctness first: output and input gradients against a float32 eager reference of the same
  inputs (relative Frobenius error; bf16 lands near 1e-2 at most),
- forward: ``fn(*inputs)`` with autograd recording, as in training;
- backward: ``autograd.grad`` of one kept output (``retain_graph``, so the same graph is reused);
- forward+backward: both, the number that matters for a training step;
- memory: what the forward keeps alive for the backward (its saved tensors and the output), and
  the peak above the inputs during forward+backward.
The GEMM-bound cells of 06 and 07 give the GPU a head start before each timed call
(``GEMM_HEAD_START_MS``), so a moment's stall of the host is not counted as kernel time.

torch.compile's backward normally frees ("donates") saved buffers as it goes, which forbids the
``retain_graph`` the backward timing needs; ``measure_fwd_bwd`` turns donation off, which can only
raise compile's peak memory a little, not change its times.

The phase scripts share the sweep around it too: the command line (``--shape``, ``--variants``) and
one cell -- measured, written as a CSV row and printed, or written and printed as a failure.
"""

import argparse
from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

from common import (
    ON_GPU,
    SHAPES,
    ResultWriter,
    bench,
    failure_row,
    interpreter_banner,
    measure_peak_memory,
    resolve_shape,
)
from common.report import render_phase

BENCH = {"warmup_ms": 25.0, "rep_ms": 150.0} if ON_GPU else {"warmup_ms": 1.0, "rep_ms": 1.0, "min_reps": 1}
# The GEMM-bound cells of 06 and 07 give the GPU this head start before each timed call (see
# common.bench): their steps are the GPU's time, and the host's stalls must not be counted in them.
# Phase 08's calls at the model's sizes are the host's, and are timed without one.
GEMM_HEAD_START_MS = 2.0


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


def measure_fwd_bwd(fn: Callable, inputs: list[Tensor], grad_out: Tensor, head_start_ms: float = 0.0) -> dict:
    """Median ms of forward, backward and forward+backward, with the memory columns; every timing
    gives the GPU ``head_start_ms`` (see common.bench)."""
    with torch._functorch.config.patch(donated_buffer=False):
        return _measure(fn, inputs, grad_out, {**BENCH, "head_start_ms": head_start_ms})


def _time_backward(out: Tensor, wrt: list[Tensor], grad_out: Tensor, budget: dict):
    """One forward's graph, backpropagated again and again; freed when this returns."""
    return bench(lambda: torch.autograd.grad(out, wrt, grad_out, retain_graph=True), **budget)


def _measure(fn: Callable, inputs: list[Tensor], grad_out: Tensor, budget: dict) -> dict:
    wrt = [t for t in inputs if t.requires_grad]

    def forward():
        return fn(*inputs)

    def forward_backward():
        torch.autograd.grad(forward(), wrt, grad_out)

    forward_backward()  # compilation and autotuning happen here, before any clock starts
    forward_backward()
    fwd = bench(forward, **budget)
    bwd = _time_backward(forward(), wrt, grad_out, budget)
    step = bench(forward_backward, **budget)

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


def check_and_measure(
    fn: Callable, reference: Callable, inputs: list[Tensor], grad_out: Tensor, head_start_ms: float = 0.0
) -> dict:
    """The error columns (checked before any clock starts), then the time and memory columns."""
    return {
        **check_against(fn, reference, inputs, grad_out),
        **measure_fwd_bwd(fn, inputs, grad_out, head_start_ms),
    }


# -- the sweep around it: command line, one cell at a time, the report at the end --------------------


def sweep_arg_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The parser with ``--shape``; a phase adds its own options, then calls ``parse_sweep_args``."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--shape",
        nargs="+",
        default=None,
        help=f"any of {', '.join(SHAPES)} (default: small mid large on a GPU, tiny on the CPU)",
    )
    return parser


def parse_sweep_args(
    parser: argparse.ArgumentParser, known_variants: list[str], argv=None
) -> argparse.Namespace:
    """Adds ``--variants`` and parses: ``args.shapes`` are resolved, ``args.variants`` checked against the known."""
    parser.add_argument("--variants", nargs="+", default=None, help="a subset of the variants (default: all)")
    args = parser.parse_args(argv)
    args.shapes = [
        resolve_shape(n) for n in (args.shape or (["small", "mid", "large"] if ON_GPU else ["tiny"]))
    ]
    args.variants = args.variants or known_variants
    for name in args.variants:
        if name not in known_variants:
            parser.error(f"--variants: unknown {name!r}; expected any of {', '.join(known_variants)}")
    return args


def start_sweep(phase: str) -> ResultWriter:
    """Says where the numbers come from (a GPU or the interpreter) and opens this run's CSV."""
    print(interpreter_banner())
    return ResultWriter(phase)


def finish_sweep(writer: ResultWriter) -> None:
    print(f"rows: {writer.path}")
    print(f"report: {render_phase(writer.phase)}")


def sweep_cell(variant: str, shape: str, dtype: torch.dtype, **sizes) -> dict:
    """The columns that name a cell: what ran (variant), on what (shape, dtype and the phase's sizes)."""
    return {"variant": variant, "shape": shape, "dtype": str(dtype).removeprefix("torch."), **sizes}


def run_cell(writer: ResultWriter, cell: dict, width: int, measure: Callable[[], dict]) -> dict | None:
    """``measure()``'s columns, or None once a failure is written as the cell's row and printed."""
    try:
        return measure()
    except Exception as err:  # a failed cell is a row; the sweep goes on
        row = writer.write({**cell, **failure_row(err)})
        print(f"  {cell['variant']:{width}s} {row['status']}: {row['error'][:160]}")
        return None


def tiles_chosen(autotuners: dict, tokens: int) -> str:
    """What each autotuned kernel chose at ``tokens`` rows, for a row's ``tiles`` column: one
    "name[flag=value,...]: BLOCK_M=...,warps=...,stages=..." entry per kernel and pass (the flags in
    its autotuning key tell the passes apart; the sizes are left out). Every pass tuned at these
    tokens so far is listed, so a variant's row may name a pass that another variant ran first.
    Empty in the interpreter, which has one config and tunes nothing."""
    sizes = {"T", "D_FF", "N_OUT", "D_IN"}
    entries = []
    for name, tuner in autotuners.items():
        for key, config in tuner.cache.items():
            values = dict(zip(tuner.keys, key, strict=False))  # the key ends with the arguments' dtypes
            if values.get("T") != tokens:
                continue
            flags = ",".join(f"{k}={int(v)}" for k, v in values.items() if k not in sizes)
            tiles = ",".join(f"{k}={v}" for k, v in config.kwargs.items())
            entries.append(f"{name}[{flags}]: {tiles},warps={config.num_warps},stages={config.num_stages}")
    return "; ".join(entries)


def measure_tflops_cell(
    writer: ResultWriter,
    cell: dict,
    width: int,
    fn: Callable,
    reference: Callable,
    inputs: list[Tensor],
    grad_out: Tensor,
    flops: float,
    tiles: Callable[[], str] | None = None,
) -> None:
    """One GEMM-bound cell (phases 06, 07): errors, times, memory and model TFLOP/s, written and printed;
    ``tiles`` says, once the cell is measured, which tiles its Triton kernels ran (``tiles_chosen``)."""
    measure = partial(check_and_measure, fn, reference, inputs, grad_out, GEMM_HEAD_START_MS)
    result = run_cell(writer, cell, width, measure)
    if result is None:
        return
    tflops = flops / (result["fwd_bwd_ms"] * 1e-3) / 1e12
    chosen = {"tiles": tiles()} if tiles else {}
    writer.write({**cell, **result, "fwd_bwd_tflops": tflops, **chosen})
    print(
        f"  {cell['variant']:{width}s} fwd {result['fwd_ms']:8.3f}  bwd {result['bwd_ms']:8.3f}  fwd+bwd "
        f"{result['fwd_bwd_ms']:8.3f} ms  {tflops:6.1f} TFLOP/s  saved {result['saved_mb']:8.1f} MB  "
        f"peak {result['peak_mb']:8.1f} MB  err {result['err_out']:.1e}/{result['err_grad']:.1e}"
    )
