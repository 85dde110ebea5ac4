"""The benchmark matrix a Slurm job array runs: its cells, and what becomes of each one.

    python -m slurm.matrix                    # the cells, one per line, then the array size
    python -m slurm.matrix array              # the --array range, e.g. 0-32 (no number kept by hand)
    python -m slurm.matrix run-cell 3         # run cell 3 here; if it dies, its rows become failure rows
    python -m slurm.matrix collect 1234       # after array job 1234: a failure row for every cell
                                              # that wrote nothing, then the report re-rendered
    python -m slurm.matrix forward 1234       # sbatch flags that job 1234 was submitted with
    python -m slurm.matrix placement -- -p gpu --time=1:00:00   # of those, where to run: --partition=gpu

``slurm/run_matrix.sbatch`` calls these; nothing here needs Slurm except ``forward`` and the job
states ``collect`` quotes. By default the matrix is phase 12's: the whole TransformerNP's training
step, one array task per shape x variant (x checkpointing x CUDA graph); environment variables
choose another, so that the templates never need editing:

    TRITONLAB_MATRIX_PHASE         the phase, by number or name (default 12_matrix); 01_baseline runs
                                   its shapes x SDPA backends, each in eager and compiled mode; any
                                   other phase that takes --shape runs one array task per shape
    TRITONLAB_MATRIX=gpu|cpu       gpu (default): small, mid, large in bf16; cpu: the tiny shape in
                                   float32 with a few steps and the variants a CPU runs -- a smoke run
    TRITONLAB_MATRIX_SHAPES        override the shapes, e.g. "small mid"
    TRITONLAB_MATRIX_VARIANTS      phase 12: override the variants, e.g. "sdpa-cudnn custom-bf16-fused"
    TRITONLAB_MATRIX_CHECKPOINT    phase 12: checkpoint modes, e.g. "none block" (default none)
    TRITONLAB_MATRIX_GRAPHS        phase 12: "off", "on" or "off on" for every shape (default: "off on"
                                   at small, whose headline is graphed, "off" elsewhere)
    TRITONLAB_MATRIX_BACKENDS      phase 01: override the SDPA backends, e.g. "cudnn flash"
    TRITONLAB_MATRIX_ARGS          extra phase arguments for every cell, e.g. "--steps 20"

A cell whose process dies (a crash, a bad argument, a kill) still leaves rows: ``run-cell`` writes a
failure row for each of the cell's rows that is missing, and ``collect`` does the same for tasks
that never got that far (cancelled, timed out), so the reports list every cell of the matrix.
"""

import argparse
import contextlib
import csv
import os
import shlex
import subprocess
import sys
from collections import deque
from dataclasses import dataclass, field

PHASE = "12_matrix"  # the default: the TransformerNP end to end, SDPA baselines against our kernels
BASELINE_PHASE = "01_baseline"  # the SDPA-only training step, by backend and mode

# Phase 12's variants on a GPU (sdpa-math, far slower, only on request), as `--variants` names them.
VARIANTS_12 = (
    "sdpa-cudnn", "sdpa-flash", "compile+sdpa-cudnn", "compile+sdpa-flash", "custom-bf16-separate",
    "custom-bf16-fused", "custom-bf16-mixed", "custom-bf16-padded", "custom-fp8-fused",
    "compile+custom-bf16-separate", "compile+custom-bf16-fused", "compile+custom-bf16-mixed",
    "compile+custom-bf16-padded", "compile+custom-fp8-fused",
)  # fmt: skip
PRESETS = {
    "gpu": {
        "shapes": ("small", "mid", "large"),
        "dtype": "bf16",
        "variants": VARIANTS_12,
        "backends": ("cudnn", "flash", "efficient", "math"),
        "modes": ("eager", "compile"),
        "extra": {},
    },
    "cpu": {
        "shapes": ("tiny",),
        # The interpreter's bf16 dots are wrong: the CPU runs our kernels in float32.
        "dtype": "fp32",
        "variants": ("sdpa-math", "custom-bf16-separate"),
        "backends": ("math", "flash"),
        "modes": ("eager",),
        "extra": {
            PHASE: ("--steps", "2", "--warmup", "1", "--loss-steps", "3"),
            BASELINE_PHASE: ("--steps", "2", "--warmup", "1"),
        },
    },
}
# Arguments the matrix sets itself: which rows a cell owes follows from them.
CELL_ARGS = ("--shape", "--sdpa-backend", "--modes", "--dtype", "--variants", "--checkpoint", "--graphs")


@dataclass(frozen=True)
class Cell:
    """One array task: ``python -m phases <phase> --shape <shape> <args>``, and the rows it owes.

    ``rows`` are the key columns of those rows when they are known in advance (phases 01 and 12:
    one per variant); for any other phase the cell owes at least one row at its shape."""

    phase: str
    shape: str
    args: tuple[str, ...] = ()
    rows: tuple[dict, ...] = field(default=(), hash=False)

    @property
    def argv(self) -> list[str]:
        return [self.phase, "--shape", self.shape, *self.args]

    def expected_rows(self) -> list[dict]:
        return [dict(row) for row in self.rows] or [{"variant": "(every variant)", "shape": self.shape}]


def _words(value: str) -> tuple[str, ...]:
    return tuple(value.replace(",", " ").split())


def matrix_phase(env) -> str:
    from phases.__main__ import phase_names, resolve

    name = env.get("TRITONLAB_MATRIX_PHASE", PHASE)
    phase = resolve(name)
    if phase is None:
        raise ValueError(
            f"TRITONLAB_MATRIX_PHASE: unknown {name!r}; expected one of {', '.join(phase_names())}"
        )
    return phase


def _baseline_cells(shapes, backends, modes, dtype, extra) -> list[Cell]:
    """Phase 01: each shape x SDPA backend, every mode in one task; modes and dtype explicit, so the
    rows a cell owes follow from its arguments alone, whatever machine reads them."""
    from tritonlab.models import SHAPES

    out = []
    for shape in shapes:
        known = SHAPES.get(shape)
        dims = {} if known is None else {
            "m_context": known.m_context, "n_target": known.n_target, "batch": known.batch, "tokens": known.tokens,
        }  # fmt: skip
        for backend in backends:
            rows = tuple(
                {
                    "variant": f"{mode}+sdpa-{backend}",
                    "shape": shape,
                    "dtype": dtype,
                    "mode": mode,
                    "sdpa_backend": backend,
                    **dims,
                }  # fmt: skip
                for mode in modes
            )
            args = ("--sdpa-backend", backend, "--modes", *modes, "--dtype", dtype, *extra)
            out.append(Cell(BASELINE_PHASE, shape, args, rows))
    return out


def _matrix_cells(shapes, variants, checkpoints, graphs, dtype, extra) -> list[Cell]:
    """Phase 12: one task per shape x variant x checkpoint mode x graph toggle (``graphs``, or each
    shape's default). Each task measures its variant alone; the report compares the cells of one
    array job (one run group)."""
    from common.step import default_graphs, variant_label

    return [
        Cell(
            PHASE,
            shape,
            ("--variants", variant, "--checkpoint", mode, "--graphs", graph, "--dtype", dtype, *extra),
            (
                {
                    "variant": variant_label(variant, mode, graph == "on"),
                    "shape": shape,
                    "dtype": dtype,
                    "base_variant": variant,
                    "checkpoint": mode,
                    "graphs": graph == "on",
                },
            ),  # fmt: skip
        )
        for shape in shapes
        for mode in checkpoints
        for graph in (graphs or default_graphs(shape))
        for variant in variants
    ]


def cells(env: dict | None = None) -> list[Cell]:
    """The matrix the environment asks for, in array-index order."""
    env = os.environ if env is None else env
    phase = matrix_phase(env)
    kind = env.get("TRITONLAB_MATRIX", "gpu")
    if kind not in PRESETS:
        raise ValueError(f"TRITONLAB_MATRIX: unknown {kind!r}; expected one of {', '.join(PRESETS)}")
    preset = PRESETS[kind]
    shapes = _words(env.get("TRITONLAB_MATRIX_SHAPES", "")) or preset["shapes"]
    user_extra = tuple(shlex.split(env.get("TRITONLAB_MATRIX_ARGS", "")))
    clash = [arg for arg in user_extra if arg.split("=")[0] in CELL_ARGS]
    if clash:
        raise ValueError(
            f"TRITONLAB_MATRIX_ARGS: {' '.join(clash)} is set per cell; choose shapes, variants, "
            "checkpointing, graphs and backends with the TRITONLAB_MATRIX_* variables"
        )
    extra = preset["extra"].get(phase, ()) + user_extra
    # The phase checks shapes, variants and backends itself: a bad one makes a failure row, like
    # any failed cell.
    if phase == BASELINE_PHASE:
        backends = _words(env.get("TRITONLAB_MATRIX_BACKENDS", "")) or preset["backends"]
        return _baseline_cells(shapes, backends, preset["modes"], preset["dtype"], extra)
    if phase == PHASE:
        variants = _words(env.get("TRITONLAB_MATRIX_VARIANTS", "")) or preset["variants"]
        checkpoints = _words(env.get("TRITONLAB_MATRIX_CHECKPOINT", "")) or ("none",)
        graphs = _words(env.get("TRITONLAB_MATRIX_GRAPHS", ""))
        return _matrix_cells(shapes, variants, checkpoints, graphs, preset["dtype"], extra)
    return [Cell(phase, shape, user_extra) for shape in shapes]


def array_range(matrix: list[Cell]) -> str:
    if not matrix:
        raise ValueError("the matrix is empty: check the TRITONLAB_MATRIX_* variables")
    return f"0-{len(matrix) - 1}"


def _cell(index: int) -> Cell:
    matrix = cells()
    if not 0 <= index < len(matrix):
        raise SystemExit(f"cell index: expected 0..{len(matrix) - 1}, got {index}")
    return matrix[index]


# --- failure rows --------------------------------------------------------------------------------


@contextlib.contextmanager
def as_array_task(array_job_id: str, task_id: int):
    """Rows written inside carry this array task's ids (and join its run group), as if the task
    had written them itself."""
    saved = {key: os.environ.get(key) for key in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID")}
    os.environ.update({"SLURM_ARRAY_JOB_ID": str(array_job_id), "SLURM_ARRAY_TASK_ID": str(task_id)})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def rows_of_task(array_job_id: str, task_id: int, phase: str) -> list[dict]:
    """Every row an array task has written (its CSVs are named after it: ``*-a<job>_<task>.csv``)."""
    from common.results import data_dir

    rows = []
    for path in sorted((data_dir() / phase).glob(f"*-a{array_job_id}_{task_id}.csv")):
        with open(path, newline="") as f:
            rows += list(csv.DictReader(f))
    return rows


def record_missing(cell: Cell, error: str) -> list[dict]:
    """A failure row for each row ``cell`` should have written in this array task and did not
    (outside an array task, e.g. ``run-cell`` by hand, one for each of the cell's rows)."""
    from common import ResultWriter

    job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    rows = rows_of_task(job, int(task), cell.phase) if job and task else []
    # A cell whose rows are known owes each by variant; any other owes one row at its shape.
    if cell.rows:
        written = {(row["variant"], row["shape"]) for row in rows}
        missing = [row for row in cell.expected_rows() if (row["variant"], row["shape"]) not in written]
    else:
        missing = [] if any(row["shape"] == cell.shape for row in rows) else cell.expected_rows()
    if not missing:
        return []
    writer = ResultWriter(cell.phase)
    return [writer.write({**row, "status": "error", "error": error[:500]}) for row in missing]


def run_cell(index: int) -> int:
    """Run one cell as a child process, echoing its output; if it fails, record why."""
    cell = _cell(index)
    cmd = [sys.executable, "-m", "phases", *cell.argv]
    print(f"cell {index}: {shlex.join(cmd)}", flush=True)
    tail: deque[str] = deque(maxlen=50)
    with subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, errors="replace") as proc:
        for line in proc.stderr:
            sys.stderr.write(line)
            tail.append(line.strip())
    if proc.returncode == 0:
        return 0
    how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
    last = next((line for line in reversed(tail) if line), "no output on stderr")
    rows = record_missing(cell, f"phase process ended with {how}: {last}")
    print(f"cell {index}: {how}; recorded {len(rows)} failure row(s)", file=sys.stderr, flush=True)
    return 1


def _job_state(job: str) -> str:
    """The Slurm state of a job or array task, while slurmctld still remembers it ('' if not)."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    fields = dict(word.split("=", 1) for word in out.stdout.split() if "=" in word)
    return fields.get("JobState", "")


def collect(array_job_id: str) -> None:
    """Once the whole array has ended: fill the gaps with failure rows, then re-render the report of
    the matrix's phase and the index (what `python -m phases report <phase>` does)."""
    from common.results import data_dir
    from phases.__main__ import report

    matrix = cells()
    for index, cell in enumerate(matrix):
        with as_array_task(array_job_id, index):
            # Slurm keeps no record of a task cancelled while pending, nor of any after MinJobAge.
            state = _job_state(f"{array_job_id}_{index}") or "no record: cancelled before it started?"
            rows = record_missing(
                cell, f"array task {array_job_id}_{index} wrote no row (Slurm state: {state})"
            )
        if rows:
            print(f"cell {index} ({state}): recorded {len(rows)} failure row(s)")
    report([matrix[0].phase] if matrix else [PHASE], data=data_dir())


# --- resubmission --------------------------------------------------------------------------------

# scontrol's field -> the sbatch flag that sets it, so that the array runs where and as the user sent
# the launcher.
_FORWARDED = {
    "Partition": "--partition",
    "Account": "--account",
    "QOS": "--qos",
    "Reservation": "--reservation",
    "TimeLimit": "--time",
    "Features": "--constraint",
    "JobName": "--job-name",
}
# The flags the collector shares with the array: where to run, not what to run with (it needs no GPU).
_PLACEMENT = {"--partition": "-p", "--account": "-A", "--qos": "-q", "--reservation": None}


def forward_flags(scontrol_line: str) -> list[str]:
    """The sbatch flags that reproduce a job's placement and resources, from ``scontrol show job -o``."""
    fields = dict(word.split("=", 1) for word in scontrol_line.split() if "=" in word)
    unset = {"", "(null)", "UNLIMITED", "Partition_Limit", "None", "N/A"}
    flags = [f"{flag}={fields[key]}" for key, flag in _FORWARDED.items() if fields.get(key, "") not in unset]
    # GPUs: --gres shows as TresPerNode=gres:gpu:h100:1 (gres/gpu:... in newer Slurm), --gpus as TresPerJob.
    for key, flag in (("TresPerNode", "--gres"), ("TresPerJob", "--gpus")):
        for tres in fields.get(key, "").split(","):
            if tres.startswith(("gres:gpu", "gres/gpu")):
                value = tres[len("gres:") :]
                flags.append(f"{flag}={value if flag == '--gres' else value.partition(':')[2]}")
    if fields.get("CPUs/Task", "1") not in unset | {"1"}:
        flags.append(f"--cpus-per-task={fields['CPUs/Task']}")
    if fields.get("MinMemoryNode", "0") not in unset | {"0"}:
        flags.append(f"--mem={fields['MinMemoryNode']}")
    return flags


def placement_flags(flags: list[str]) -> list[str]:
    """Of some sbatch flags, those that say where to run (``--partition=gpu``, ``-p gpu``, ...)."""
    aliases = {short: long for long, short in _PLACEMENT.items() if short} | {
        long: long for long in _PLACEMENT
    }
    kept, words = [], iter(flags)
    for word in words:
        name, eq, value = word.partition("=")
        if name in aliases:
            kept.append(f"{aliases[name]}={value if eq else next(words, '')}")
    return kept


def forward(job_id: str) -> list[str]:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True, timeout=30
    )
    return forward_flags(out.stdout)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm.matrix", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("list", help="the cells and the array size (the default)")
    sub.add_parser("array", help="the --array range")
    sub.add_parser("run-cell", help="run one cell; a dead process becomes failure rows").add_argument(
        "index", type=int
    )
    sub.add_parser("collect", help="fill gaps with failure rows, re-render reports").add_argument(
        "array_job_id"
    )
    sub.add_parser("forward", help="sbatch flags to resubmit like a given job").add_argument("job_id")
    sub.add_parser(
        "placement", help="of some sbatch flags (after --), those saying where to run"
    ).add_argument("flags", nargs="*")
    args = parser.parse_args(argv)

    try:
        if args.command in (None, "list"):
            matrix = cells()
            for index, cell in enumerate(matrix):
                print(f"{index:3d}  python -m phases {shlex.join(cell.argv)}")
            print(f"array size: {len(matrix)} (--array={array_range(matrix)})")
        elif args.command == "array":
            print(array_range(cells()))
        elif args.command == "run-cell":
            return run_cell(args.index)
        elif args.command == "collect":
            collect(args.array_job_id)
        elif args.command == "forward":
            print(shlex.join(forward(args.job_id)))
        elif args.command == "placement":
            print(shlex.join(placement_flags(args.flags)))
    except ValueError as err:
        parser.error(str(err))
    return 0


if __name__ == "__main__":
    sys.exit(main())
