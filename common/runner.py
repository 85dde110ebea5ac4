"""The one benchmark runner: a phase declares its cells, the runner runs them and keeps every row.

A :class:`Cell` names what runs (variant, shape, dtype and the phase's own size columns) and carries
``run``, a callable that checks correctness and then measures, returning the row's measurement
columns (``timed`` builds the usual ones). :func:`run_cells` runs the cells in order:

- each finished cell is written as a row at once (flushed to disk), so a killed run loses nothing;
- a cell that raises -- a wrong result, an out-of-memory, a compile error -- becomes a row with
  ``status`` "oom" or "error" and the message, and the sweep goes on;
- a progress bar shows cells done of total and the current cell on a terminal; in a log (not a
  terminal) each cell prints one line instead.

Like Triton's ``perf_report`` and Liger-Kernel's ``run_benchmarks``, a phase says *what* to measure;
unlike them, rows carry their provenance and failures are rows.
"""

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from .device import ON_GPU
from .results import ResultWriter, failure_row
from .timing import Timing, bench


@dataclass
class Cell:
    variant: str
    shape: str
    dtype: str
    run: Callable[[], dict]
    columns: dict = field(default_factory=dict)

    def key(self) -> dict:
        return {"variant": self.variant, "shape": self.shape, "dtype": self.dtype, **self.columns}

    def label(self) -> str:
        return f"{self.variant} · {self.shape} · {self.dtype}"


def timed(
    fn: Callable[[], object],
    *,
    flops: float | None = None,
    nbytes: float | None = None,
    prefix: str = "",
    **bench_kw,
) -> dict:
    """``bench(fn)``'s median and spread as row columns, with TFLOP/s and GB/s where counts are given
    (the work the operation needs, not what an implementation happens to do)."""
    return timing_row(bench(fn, **bench_kw), flops=flops, nbytes=nbytes, prefix=prefix)


def timing_row(
    timing: Timing, *, flops: float | None = None, nbytes: float | None = None, prefix: str = ""
) -> dict:
    """A :class:`Timing` as :func:`timed`'s row columns."""
    row = timing.as_row(prefix)
    seconds = timing.ms * 1e-3
    if flops is not None:
        row[f"{prefix}tflops"] = flops / seconds / 1e12
    if nbytes is not None:
        row[f"{prefix}gbps"] = nbytes / seconds / 1e9
    return row


def check_close(name: str, err: float, tol: float) -> None:
    """Raise (so the cell becomes a failure row) when an error exceeds its bound, or is NaN."""
    if not err <= tol:
        raise AssertionError(f"{name}: error {err:.3g} exceeds {tol:.3g}")


def _summary(row: dict) -> str:
    parts = [f"{row['variant']:20s} {row['shape']:12s} {row['dtype']:5s}"]
    if row.get("status", "ok") != "ok":
        return f"{parts[0]} {row['status']}: {str(row.get('error', ''))[:140]}"
    for key in ("ms", "fwd_ms", "fwd_bwd_ms", "step_ms", "tflops", "fwd_bwd_tflops", "gbps", "peak_mem_gb"):
        value = row.get(key)
        if isinstance(value, float):
            parts.append(f"{key} {value:.4g}")
    return "  ".join(parts)


def run_cells(
    writer: ResultWriter,
    cells: Iterable[Cell],
    *,
    total: int | None = None,
    on_row: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Run every cell, writing one row each (measurements or the failure); returns the rows.

    ``cells`` may be a generator (a phase builds a shape's inputs once for its variants, then drops
    them); give ``total`` then, for the progress bar.
    """
    cells = list(cells) if total is None else cells
    total = len(cells) if total is None else total
    interactive = sys.stderr.isatty()
    rows = []
    with tqdm(total=total, disable=not interactive, unit="cell", dynamic_ncols=True, file=sys.stderr) as bar:
        for cell in cells:
            bar.set_postfix_str(cell.label())
            try:
                result = cell.run()
                row = writer.write({**cell.key(), **result})
            except Exception as err:  # a failed cell is a row, and the sweep goes on
                row = writer.write({**cell.key(), **failure_row(err)})
            if ON_GPU:
                torch.cuda.empty_cache()
            rows.append(row)
            if on_row:
                on_row(row)
            (bar.write if interactive else print)(f"  {_summary(row)}")
            bar.update()
    return rows
