"""Phase 09's cells: the TransformerNP's training step per shape and checkpoint mode, at the shape's
batch and at every batch a search for the largest one that fits tries.

Every measurement is ``common.step.measure_training_step`` (forward, backward, AdamW; median step
time, tokens/s = B·(M+N) / step time, peak memory) run as a ``common.runner.Cell``, so an
out-of-memory is a row with status "oom" and never ends the run.
"""

import dataclasses
import gc
from collections.abc import Callable, Iterator

import torch

from common import ON_GPU, Cell, OutOfMemory, ResultWriter, run_cells
from common.step import measure_training_step, shape_columns
from tritonlab.models import Components, TNPConfig, TNPShape, sdpa_attention

# Bisection stops once the largest batch that fits is known to within this fraction of itself:
# the batch a user would pick, found in about three probes after the doubling, not the last unit.
SEARCH_PRECISION = 1 / 8
# The search's default ceiling: this multiple of the shape's batch on a GPU, and a tiny batch on the CPU,
# where nothing runs out of memory and the interpreter is slow.
GPU_CAP_FACTOR = 64
CPU_CAP = 8
# The model a machine without a GPU runs: the spec's 12 layers of width 512 take seconds a step
# there; these dims check the same code paths in a fraction of that.
CPU_CONFIG = TNPConfig(n_layers=2, n_heads=2, head_dim=16, d_ff=40, n_components=3, d_head_hidden=24)


def model_config() -> TNPConfig:
    """The spec's TransformerNP on a GPU, :data:`CPU_CONFIG` on the CPU."""
    return TNPConfig() if ON_GPU else CPU_CONFIG


def _triton(name: str) -> Callable:
    from tritonlab import attention  # the kernels: imported only when a run asks for them

    return {"triton": attention.attention, "triton-fused": attention.fused_attention}[name]


# --attention: SDPA pinned to one backend (no silent fallback), or the library's Triton kernels.
ATTENTIONS: dict[str, Callable[[], Callable]] = {
    "sdpa-cudnn": lambda: sdpa_attention("cudnn"),
    "sdpa-flash": lambda: sdpa_attention("flash"),
    "sdpa-efficient": lambda: sdpa_attention("efficient"),
    "sdpa-math": lambda: sdpa_attention("math"),
    "triton": lambda: _triton("triton"),
    "triton-fused": lambda: _triton("triton-fused"),
}


# Libraries that allocate their own workspace report running out of memory as a plain RuntimeError.
OOM_MESSAGES = ("out of memory", "CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_ALLOC_FAILED")


def as_out_of_memory(err: RuntimeError) -> RuntimeError:
    """``err`` as :class:`common.OutOfMemory` (a row with status "oom") if its message says the device
    ran out of memory, as cuDNN's and cuBLAS's allocation failures do; else ``err`` itself."""
    if isinstance(err, OutOfMemory | torch.OutOfMemoryError):
        return err
    message = str(err)
    if any(m.lower() in message.lower() for m in OOM_MESSAGES):
        return OutOfMemory((message.splitlines() or [""])[0][:300])
    return err


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every cell of a run shares: the model, the attention, dtype, compilation and step counts."""

    cfg: TNPConfig
    attention: str
    dtype: str
    compile_model: bool = False
    steps: int = 10
    warmup: int = 2
    search_steps: int = 3
    search_warmup: int = 1

    def variant(self, mode: str) -> str:
        return f"{'compile+' if self.compile_model else ''}ckpt-{mode}+{self.attention}"


def step_cell(setup: Setup, shape: TNPShape, mode: str, role: str, *, steps: int, warmup: int) -> Cell:
    """One training-step measurement at ``shape`` (its batch included) with checkpoint ``mode``.
    ``role`` is "shape" (the shape's own batch) or "search" (a probe of the batch search)."""

    def run() -> dict:
        try:
            result = measure_training_step(
                setup.cfg,
                Components(attention=ATTENTIONS[setup.attention]()),
                shape,
                setup.dtype,
                compile_model=setup.compile_model,
                warmup=warmup,
                steps=steps,
                checkpoint=mode,
            )
        except RuntimeError as err:
            converted = as_out_of_memory(err)
            if converted is err:
                raise
            if ON_GPU:
                torch.cuda.empty_cache()
            raise converted from err
        return result.as_row()

    columns = {
        "checkpoint": mode,
        "attention": setup.attention,
        "compile": setup.compile_model,
        "role": role,
        **shape_columns(setup.cfg, shape),
    }
    return Cell(setup.variant(mode), shape.name, setup.dtype, run, columns)


def shape_cells(setup: Setup, shapes: list[TNPShape], modes: list[str]) -> Iterator[Cell]:
    """Per shape and mode, the step at the shape's batch. The large shape runs at most 3 timed
    steps after at most one warm-up: each takes seconds."""
    for shape in shapes:
        steps = min(setup.steps, 3) if shape.name == "large" else setup.steps
        warmup = min(setup.warmup, 1) if shape.name == "large" else setup.warmup
        for mode in modes:
            yield step_cell(setup, shape, mode, "shape", steps=steps, warmup=warmup)


def default_cap(shape: TNPShape) -> int:
    return shape.batch * GPU_CAP_FACTOR if ON_GPU else max(CPU_CAP, shape.batch)


@dataclasses.dataclass
class SearchResult:
    max_batch: int  # the largest batch that ran (0: none did)
    oom_batch: int | None  # the smallest batch that ran out of memory (None: none did)
    stopped: str  # "bracketed", "cap" (the ceiling fits) or "error: ..." (a probe failed otherwise)
    probes: list[int]  # the batches run, in order

    def as_row(self) -> dict:
        return {
            "max_batch": self.max_batch,
            "oom_batch": "" if self.oom_batch is None else self.oom_batch,
            "stopped": self.stopped,
            "probes": " ".join(map(str, self.probes)),
        }


def find_max_batch(
    probe: Callable[[int], str], start: int, cap: int, known: dict[int, str] | None = None
) -> SearchResult:
    """The largest batch in [1, cap] for which ``probe(batch)`` says "ok", by doubling from ``start``
    and then bisecting between the largest batch that fits and the smallest that runs out of memory
    ("oom"), until they are within ``SEARCH_PRECISION``. ``known`` holds outcomes already measured
    (the shape's own batch), which are not probed again. Any other outcome (an error) ends the search
    at the largest batch that fit: memory did not decide it."""
    if start < 1 or cap < 1:
        raise ValueError(f"batch search: start and cap must be >= 1, got start={start}, cap={cap}")
    outcomes = dict(known or {})
    probes: list[int] = []
    lo, hi = 0, None  # lo ran; hi (if any) ran out of memory

    def test(batch: int) -> str:
        nonlocal lo, hi
        if batch not in outcomes:
            outcomes[batch] = probe(batch)
            probes.append(batch)
        outcome = outcomes[batch]
        if outcome == "ok":
            lo = max(lo, batch)
        elif outcome == "oom":
            hi = batch if hi is None else min(hi, batch)
        return outcome

    batch = min(start, cap)
    while True:  # doubling
        outcome = test(batch)
        if outcome not in ("ok", "oom"):
            return SearchResult(lo, hi, f"error at batch {batch}: {outcome}", probes)
        if outcome == "oom" or batch == cap:
            break
        batch = min(2 * batch, cap)
    if hi is None:
        return SearchResult(lo, None, "cap", probes)
    while hi - lo > max(1, int(lo * SEARCH_PRECISION)):  # bisection
        batch = (lo + hi) // 2
        outcome = test(batch)
        if outcome not in ("ok", "oom"):
            return SearchResult(lo, hi, f"error at batch {batch}: {outcome}", probes)
    return SearchResult(lo, hi, "bracketed", probes)


def free_device_memory() -> None:
    """What an out-of-memory probe left behind (its frames and tensors) goes before the next probe."""
    gc.collect()
    if ON_GPU:
        torch.cuda.empty_cache()


def search_batch(
    writer: ResultWriter,
    setup: Setup,
    shape: TNPShape,
    mode: str,
    *,
    cap: int,
    known: dict[int, str] | None = None,
) -> tuple[SearchResult, list[dict]]:
    """Search the largest batch that fits for ``shape`` and ``mode``: every probe is a row (measured,
    "oom" or "error"), and one row of role "max" sums the search up. Returns the result and the rows."""
    rows: list[dict] = []

    def probe(batch: int) -> str:
        cell = step_cell(
            setup,
            dataclasses.replace(shape, batch=batch),
            mode,
            "search",
            steps=setup.search_steps,
            warmup=setup.search_warmup,
        )
        (row,) = run_cells(writer, [cell])
        rows.append(row)
        free_device_memory()
        return row["status"] if row["status"] in ("ok", "oom") else str(row.get("error", "error"))

    result = find_max_batch(probe, shape.batch, cap, known)
    summary = {
        "variant": setup.variant(mode),
        "shape": shape.name,
        "dtype": setup.dtype,
        "checkpoint": mode,
        "attention": setup.attention,
        "compile": setup.compile_model,
        "role": "max",
        "m_context": shape.m_context,
        "n_target": shape.n_target,
        "batch": result.max_batch,
        "tokens": result.max_batch * (shape.m_context + shape.n_target),
        "search_cap": cap,
        **result.as_row(),
    }
    rows.append(writer.write(summary))
    oom = "" if result.oom_batch is None else f", out of memory at {result.oom_batch}"
    print(
        f"  {setup.variant(mode)} {shape.name}: largest batch {result.max_batch}{oom} ({result.stopped}; "
        f"probed {' '.join(map(str, result.probes)) or 'nothing new'})"
    )
    return result, rows


def run_phase(
    writer: ResultWriter,
    setup: Setup,
    shapes: list[TNPShape],
    modes: list[str],
    *,
    search: bool = True,
    max_batch: int | None = None,
) -> list[dict]:
    """Per shape: every mode at the shape's batch, then (``search``) each mode's batch search up to
    ``max_batch`` (default: :func:`default_cap`). Returns every row written."""
    rows = []
    for shape in shapes:
        shape_rows = run_cells(writer, shape_cells(setup, [shape], modes))
        rows += shape_rows
        free_device_memory()
        if not search:
            continue
        cap = max_batch or default_cap(shape)
        for mode, row in zip(modes, shape_rows, strict=True):
            if row["status"] not in ("ok", "oom"):
                print(
                    f"  {setup.variant(mode)} {shape.name}: no batch search, the step failed: {row['error']}"
                )
                continue
            rows += search_batch(writer, setup, shape, mode, cap=cap, known={shape.batch: row["status"]})[1]
    return rows
