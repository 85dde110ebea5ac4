"""The benchmark matrix a Slurm job array runs: its cells, and what becomes of each one.

    python -m slurm.matrix                    # the cells, one per line, then the array size
    python -m slurm.matrix array              # the --array range, e.g. 0-11 (no number kept by hand)
    python -m slurm.matrix run-cell 3         # run cell 3 here; if it dies, its rows become failure rows
    python -m slurm.matrix collect 1234       # after array job 1234: a failure row for every cell
                                              # that wrote nothing, then the report re-rendered
    python -m slurm.matrix forward 1234       # sbatch flags that job 1234 was submitted with
    python -m slurm.matrix placement -- -p gpu --time=1:00:00   # of those, where to run: --partition=gpu

``slurm/run_matrix.sbatch`` calls these; nothing here needs Slurm except ``forward`` and the job
states ``collect`` quotes. The cells are one phase's shapes (x SDPA backends for phase 01), chosen by
environment variables so that the templates never need editing:

    TRITONLAB_MATRIX_PHASE         the phase, by number or name (default 01_baseline); any phase that
                                   takes --shape runs one array task per shape
    TRITONLAB_MATRIX=gpu|cpu       gpu (default): small, mid, large (phase 01: x cudnn, flash,
                                   efficient, math, eager and compile); cpu: the tiny shape (phase 01:
                                   x math, flash, eager, 2 steps) -- a smoke run
    TRITONLAB_MATRIX_SHAPES        override the shapes, e.g. "small mid"
    TRITONLAB_MATRIX_BACKENDS      phase 01: override the backends, e.g. "cudnn flash"
    TRITONLAB_MATRIX_ARGS          extra phase arguments for every cell, e.g. "--steps 20"

A cell whose process dies (a crash, a bad argument, a kill) still leaves rows: ``run-cell`` writes a
failure row for each of the cell's variants that has none, and ``collect`` does the same for tasks
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
from dataclasses import dataclass

PHASE = "01_baseline"  # the default phase: the TransformerNP training step on SDPA

PRESETS = {
    "gpu": {
        "shapes": ("small", "mid", "large"),
        "backends": ("cudnn", "flash", "efficient", "math"),
        "modes": ("eager", "compile"),
        "extra": (),
    },
    "cpu": {
        "shapes": ("tiny",),
        "backends": ("math", "flash"),
        "modes": ("eager",),
        "extra": ("--steps", "2", "--warmup", "1"),
    },
}
DTYPE = "bf16"
# Arguments the matrix sets itself: which rows a cell owes follows from them.
CELL_ARGS = ("--shape", "--sdpa-backend", "--modes", "--dtype")


@dataclass(frozen=True)
class Cell:
    """One array task: a phase at one shape (phase 01: with one SDPA backend, in every mode)."""

    shape: str
    backend: str | None = None
    modes: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    phase: str = PHASE

    @property
    def argv(self) -> list[str]:
        """``python -m phases <argv>``; for phase 01 modes and dtype are explicit, so the rows a cell
        must write follow from its arguments alone, whatever machine reads them."""
        if self.phase != PHASE:
            return [self.phase, "--shape", self.shape, *self.extra]
        return [
            PHASE,
            "--shape",
            self.shape,
            "--sdpa-backend",
            self.backend,
            "--modes",
            *self.modes,
            "--dtype",
            DTYPE,
            *self.extra,
        ]

    def expected_rows(self) -> list[dict]:
        """The key columns of the rows this cell writes: phase 01's are known in advance; of another
        phase's, at least one row at the cell's shape (its variants are the phase's to choose)."""
        if self.phase != PHASE:
            return [{"variant": "(every variant)", "shape": self.shape}]
        from tritonlab.models import SHAPES

        shape = SHAPES.get(self.shape)
        dims = (
            {}
            if shape is None
            else {
                "m_context": shape.m_context,
                "n_target": shape.n_target,
                "batch": shape.batch,
                "tokens": shape.tokens,
            }
        )
        return [
            {
                "variant": f"{mode}+sdpa-{self.backend}",
                "shape": self.shape,
                "dtype": DTYPE,
                "mode": mode,
                "sdpa_backend": self.backend,
                **dims,
            }
            for mode in self.modes
        ]


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


def cells(env: dict | None = None) -> list[Cell]:
    """The matrix the environment asks for, in array-index order."""
    env = os.environ if env is None else env
    phase = matrix_phase(env)
    kind = env.get("TRITONLAB_MATRIX", "gpu")
    if kind not in PRESETS:
        raise ValueError(f"TRITONLAB_MATRIX: unknown {kind!r}; expected one of {', '.join(PRESETS)}")
    preset = PRESETS[kind]
    shapes = _words(env.get("TRITONLAB_MATRIX_SHAPES", "")) or preset["shapes"]
    backends = _words(env.get("TRITONLAB_MATRIX_BACKENDS", "")) or preset["backends"]
    extra = preset["extra"] + tuple(shlex.split(env.get("TRITONLAB_MATRIX_ARGS", "")))
    clash = [arg for arg in extra if arg.split("=")[0] in CELL_ARGS]
    if clash:
        raise ValueError(
            f"TRITONLAB_MATRIX_ARGS: {' '.join(clash)} is set per cell; choose shapes and "
            "backends with TRITONLAB_MATRIX_SHAPES and TRITONLAB_MATRIX_BACKENDS"
        )
    # The phase checks shapes and backends itself: a bad one makes a failure row, like any failed cell.
    if phase != PHASE:
        extra = tuple(tuple(shlex.split(env.get("TRITONLAB_MATRIX_ARGS", ""))))
        return [Cell(shape, extra=extra, phase=phase) for shape in shapes]
    return [Cell(shape, backend, preset["modes"], extra) for shape in shapes for backend in backends]


def array_range(matrix: list[Cell]) -> str:
    if not matrix:
        raise ValueError("the matrix is empty: check TRITONLAB_MATRIX_SHAPES and TRITONLAB_MATRIX_BACKENDS")
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


def rows_of_task(array_job_id: str, task_id: int, phase: str = PHASE) -> list[dict]:
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
    written = {(row["variant"], row["shape"]) for row in rows}
    shapes_written = {row["shape"] for row in rows}
    missing = [
        row
        for row in cell.expected_rows()
        if (row["variant"], row["shape"]) not in written
        and not (cell.phase != PHASE and row["shape"] in shapes_written)
    ]
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
