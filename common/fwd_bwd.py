"""Forward, backward and forward+backward of one differentiable function, as runner cells and a report.

Phases 06-08 measure every variant alike, side by side in one run (one :class:`common.runner.Cell`
per variant and shape, built by :func:`fwd_bwd_cell`):

- correctness first: output and input gradients against a float32 eager reference on float32 copies
  of the same inputs (relative Frobenius error; bf16 lands near 3e-3), checked against
  ``TOLERANCE`` before any clock starts;
- forward: ``fn(*inputs)`` with autograd recording, as in training;
- backward: ``autograd.grad`` of one kept output (``retain_graph``, so the same graph is reused);
- forward+backward: both, the number that matters for a training step;
- memory: what the forward keeps alive for the backward (its saved tensors and the output), and
  the peak above the inputs during forward+backward;
- the tiles the Triton kernels' autotuners picked (a ``tritonlab.tuning.ConfigRecord``), where given.

The GEMM-bound cells of 06 and 07 give the GPU a head start before each timed call
(``GEMM_HEAD_START_MS``, see ``common.timing.bench``), so a moment's stall of the host is not
counted as kernel time; 08's host-bound calls are timed without one.

torch.compile's backward normally frees ("donates") saved buffers as it goes, which forbids the
``retain_graph`` the backward timing needs; :func:`measure_fwd_bwd` turns donation off, which can
only raise compile's peak memory a little, not change its times.

:func:`fwd_bwd_parser` is the command line all three share (the TNP shapes, ``--variants``),
:func:`fwd_bwd_main` the whole script of 06 and 07, and :func:`render_sweep` the report: the latest
row of each cell, speedups against baselines of the same run, the goals' lines, a table of every
cell, a figure, the tiles, the failures; :func:`fwd_bwd_verdicts` their headline verdicts.
"""

from collections.abc import Callable, Iterable

import pandas as pd
import torch
import torch._functorch.config
from torch import Tensor

from tritonlab.testing import DTYPES, rel_err
from tritonlab.tuning import ConfigRecord

from .cli import choices_argument, parse_phase_args, phase_parser, phase_run, refuse_bf16_on_cpu
from .device import ON_GPU
from .memory import measure_peak_memory
from .report import (  # much the same list as other modules': a declaration, not logic
    Figures,
    Verdict,
    add_speedup,
    best_baseline_verdict,
    failures_table,
    markdown_table,
    select_latest,
)
from .runner import Cell, check_close, run_cells
from .timing import bench

SHAPE_ORDER = {"tiny": 0, "small": 1, "mid": 2, "large": 3}  # the --shape choices, in this order
BENCH = {"warmup_ms": 25.0, "rep_ms": 150.0} if ON_GPU else {"warmup_ms": 1.0, "rep_ms": 1.0, "min_reps": 1}
GEMM_HEAD_START_MS = 2.0
# Relative error against the float32 reference that a cell must stay under: 16-bit outputs are
# rounded once (bf16 keeps 8 bits: ~3e-3 measured); float32 runs IEEE products.
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}


def fwd_bwd_parser(phase: str, description: str, variants, *, dtypes, epilog: str):
    """The parser of phases 06-08: the TNP shapes (tiny, small, mid, large: small, mid and large by
    default on a GPU, tiny on the CPU), ``--dtype`` of ``dtypes`` (bf16 by default on a GPU, fp32 on
    the CPU) and ``--variants``, any of ``variants`` (default: all)."""
    parser = phase_parser(
        phase, description, shapes=tuple(SHAPE_ORDER), gpu_shapes=("small", "mid", "large"), dtypes=dtypes,
        default_dtype="bf16" if ON_GPU else "fp32", epilog=epilog,
    )  # fmt: skip
    choices_argument(parser, "--variants", variants, "VARIANT")
    return parser


def fwd_bwd_main(
    phase: str,
    doc: str,
    variants,
    cells: Callable[[list[str], list[str], torch.dtype], Iterable[Cell]],
    report,
    argv=None,
) -> None:
    """The script of phases 06 and 07: :func:`fwd_bwd_parser` (the first line of the phase's ``doc``
    its description; any dtype, bf16 refused on the CPU), then one cell per shape and variant from
    ``cells(shapes, variants, dtype)``, then ``report`` rendered."""
    parser = fwd_bwd_parser(
        phase,
        doc.strip().splitlines()[0],
        variants,
        dtypes=tuple(DTYPES),
        epilog="variants: " + ", ".join(variants),
    )
    args = parse_phase_args(parser, argv)
    refuse_bf16_on_cpu(parser, args.dtype)
    with phase_run(phase, report, no_report=args.no_report) as writer:
        total = len(args.shape) * len(args.variants)
        run_cells(writer, cells(args.shape, args.variants, DTYPES[args.dtype]), total=total)


def dtype_column(dtype: torch.dtype) -> str:
    """The ``dtype`` column of these phases' rows: torch's name ("bfloat16"), as the committed rows."""
    return str(dtype).removeprefix("torch.")


def reference_errors(fn: Callable, reference: Callable, inputs: list[Tensor], grad_out: Tensor) -> dict:
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
    gives the GPU ``head_start_ms``."""
    budget = {**BENCH, "head_start_ms": head_start_ms}
    wrt = [t for t in inputs if t.requires_grad]

    def forward():
        return fn(*inputs)

    def forward_backward():
        torch.autograd.grad(forward(), wrt, grad_out)

    with torch._functorch.config.patch(donated_buffer=False):
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


def _time_backward(out: Tensor, wrt: list[Tensor], grad_out: Tensor, budget: dict):
    """One forward's graph, backpropagated again and again; freed when this returns."""
    return bench(lambda: torch.autograd.grad(out, wrt, grad_out, retain_graph=True), **budget)


def tiles_column(record: ConfigRecord) -> str:
    """The configs a cell's autotuned launches picked: "kernel: BLOCK_M=...,warps=...,stages=...; ..."."""
    return "; ".join(f"{kernel}: {config}" for kernel, config in record.picked.items())


def fwd_bwd_cell(
    variant: str,
    shape: str,
    dtype: torch.dtype,
    sizes: dict,
    fn: Callable,
    reference: Callable,
    inputs: list[Tensor],
    grad_out: Tensor,
    *,
    flops: float | None = None,
    nbytes: float | None = None,
    head_start_ms: float = 0.0,
    record: ConfigRecord | None = None,
    extra: dict | None = None,
) -> Cell:
    """One cell: errors checked (``TOLERANCE`` of ``dtype``), then times and memory, then model
    TFLOP/s (``flops``) or GB/s (``nbytes``) of the forward+backward, then the ``tiles`` ``record``
    collected. ``sizes`` are the row's size columns; ``extra`` columns follow them (08's ``mode``)."""

    def run() -> dict:
        errors = reference_errors(fn, reference, inputs, grad_out)
        for name, err in errors.items():
            check_close(f"{variant} {name} vs float32", err, TOLERANCE[dtype])
        row = {**errors, **measure_fwd_bwd(fn, inputs, grad_out, head_start_ms)}
        seconds = row["fwd_bwd_ms"] * 1e-3
        if flops is not None:
            row["fwd_bwd_tflops"] = flops / seconds / 1e12
        if nbytes is not None:
            row["fwd_bwd_gbps"] = nbytes / seconds / 1e9
        if record is not None:
            row["tiles"] = tiles_column(record)
        return row

    return Cell(variant, shape, dtype_column(dtype), run, {**sizes, **(extra or {})})


# -- the report the three phases share ---------------------------------------------------------------

KEYS = ["variant", "shape", "dtype"]


def render_sweep(
    df: pd.DataFrame,
    fig: Figures,
    *,
    size: str,
    throughput: str,
    baselines: list[str],
    sort_by: list[str],
    intro: str,
    goal_lines: Callable[[pd.DataFrame], list[str]],
    goals_over: str = "forward+backward",
    memory: tuple[str, ...] = ("saved_mb", "peak_mb"),
    plot: dict,
    unplotted: tuple[str, ...] = (),
) -> str:
    """The latest row of each cell, speedups against the ``baselines`` measured in the same run, the
    goals' lines, a table of every cell, a figure over ``size`` (the row count column; ``plot`` holds
    the rest of ``Figures.line_plot``'s arguments, ``unplotted`` the variants it leaves out), the tiles
    the autotuners chose, the failures."""
    df = select_latest(df, KEYS)
    ok = df.loc[df["status"] == "ok"].copy()
    if ok.empty:
        return "_no successful rows_\n" + failures_table(df)
    for baseline in baselines:
        ok = add_speedup(ok, ["shape", "dtype"], baseline, "fwd_bwd_ms")
    ok = ok.sort_values(sort_by, key=lambda s: s.map(SHAPE_ORDER) if s.name == "shape" else s)
    columns = [
        *["shape", size, "variant", "fwd_ms", "bwd_ms", "fwd_bwd_ms", throughput],
        *[f"speedup_vs_{baseline}" for baseline in baselines],
        *memory,
        *["err_out", "err_grad"],
    ]
    parts = [
        intro,
        f"## Goals ({goals_over})\n",
        "\n".join(goal_lines(ok)) or "_not measured yet_",
        "\n## All cells\n",
        markdown_table(ok, [c for c in columns if c in ok]),
        fig.line_plot(ok.loc[~ok["variant"].isin(unplotted)], x=size, series="variant", logx=True, **plot),
        tiles_table(ok),
        failures_table(df),
    ]
    return "\n".join(parts)


def tiles_table(ok: pd.DataFrame) -> str:
    """The tiles the autotuner chose for each Triton cell, where the rows record them."""
    if "tiles" not in ok.columns:
        return ""
    tuned = ok.loc[ok["tiles"].fillna("").astype(str) != ""]
    if tuned.empty:
        return ""
    return "\n## Tiles the autotuner chose\n\n" + markdown_table(tuned, ["shape", "variant", "tiles"])


def dtype_names(df: pd.DataFrame) -> str:
    """The rows' dtypes for a report's prose ("bfloat16, float32"); bfloat16 when there are none."""
    return ", ".join(sorted(df["dtype"].dropna().unique())) or "bfloat16"


def fwd_bwd_verdicts(phase: str, ours: str, cells: list[tuple]) -> list[Verdict]:
    """Headline verdicts: ``ours``'s bf16 forward+backward time against the best of a cell's
    baselines. ``cells`` are (rows, shape, cell label, baselines, goal); a cell whose rows lack the
    variants gives none."""
    verdicts = [
        best_baseline_verdict(
            phase,
            rows,
            cell=cell,
            where={"shape": shape, "dtype": "bfloat16"},
            ours=ours,
            baselines=baselines,
            goal=goal,
            metric="fwd_bwd_ms",
        )
        for rows, shape, cell, baselines, goal in cells
    ]
    return [v for v in verdicts if v is not None]
