"""Result rows, appended to ``reports/data/<phase>/<run-id>.csv`` as they are measured.

Each row is written, flushed and fsync'ed before the next measurement starts, so a killed run
keeps every finished row. The run id names the UTC start time, the host, the process and any
SLURM array task, so concurrent runs never write the same file.
"""

import csv
import datetime as dt
import itertools
import os
import platform
import traceback
from pathlib import Path

from .device import ON_GPU
from .provenance import REPO_ROOT, provenance

# Columns every row has, in this order, ahead of the measurements.
KEY_COLUMNS = ["phase", "variant", "shape", "dtype", "status", "error"]


def data_dir() -> Path:
    """Where rows go: ``TRITONLAB_DATA_DIR`` if set (``--out``, the tests), else ``reports/data`` on a
    GPU and the ignored ``out/cpu/data`` on the CPU, so a smoke run never touches tracked files."""
    if os.environ.get("TRITONLAB_DATA_DIR"):
        return Path(os.environ["TRITONLAB_DATA_DIR"])
    return REPO_ROOT / "reports" / "data" if ON_GPU else REPO_ROOT / "out" / "cpu" / "data"


_WRITERS_IN_THIS_PROCESS = itertools.count()


def _run_id() -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    # Time, host and process tell runs apart; the counter, two writers of one process in one second.
    parts = [stamp, platform.node().split(".")[0] or "host", f"p{os.getpid()}"]
    if (n := next(_WRITERS_IN_THIS_PROCESS)) > 0:
        parts.append(f"w{n}")
    if os.environ.get("SLURM_ARRAY_JOB_ID"):
        parts.append(f"a{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '0')}")
    elif os.environ.get("SLURM_JOB_ID"):
        parts.append(f"j{os.environ['SLURM_JOB_ID']}")
    return "-".join(parts)


def failure_row(err: BaseException) -> dict:
    """The ``status`` and ``error`` columns of a cell that did not finish."""
    import torch

    from .memory import OutOfMemory

    status = "oom" if isinstance(err, OutOfMemory | torch.OutOfMemoryError) else "error"
    last = traceback.format_exception_only(type(err), err)[-1].strip()
    return {"status": status, "error": last[:500]}


class ResultWriter:
    """Appends rows for one phase and one run; every row gets the provenance columns.

    ``run_group`` ties together the rows that were measured side by side: the SLURM array job
    when the cells of a matrix run as separate tasks, else this run. Speedups are only ever
    computed between rows of the same group.
    """

    def __init__(self, phase: str, run_id: str | None = None, subdir: str = ""):
        self.phase = phase
        self.run_id = run_id or _run_id()
        self.run_group = os.environ.get("SLURM_ARRAY_JOB_ID") or self.run_id
        # A subdir keeps rows of another kind (profiles) out of the phase's benchmark tables.
        self.path = data_dir() / phase / subdir / f"{self.run_id}.csv"
        self.rows: list[dict] = []

    def write(self, row: dict) -> dict:
        full = {key: "" for key in KEY_COLUMNS}
        full.update({"phase": self.phase, "status": "ok"})
        full.update(row)
        full.update(provenance())
        full.update({"run_id": self.run_id, "run_group": self.run_group})
        self.rows.append(full)
        self._append(full)
        return full

    def _append(self, row: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        header = self._header()
        if header is not None and all(key in header for key in row):
            with open(self.path, "a", newline="") as f:
                csv.DictWriter(f, fieldnames=header).writerow(row)
                f.flush()
                os.fsync(f.fileno())
            return
        # First row, or a row with new columns: rewrite the whole file under a temporary name and
        # rename it into place, so a reader (or a kill) never sees half a file.
        columns = list(header or [])
        for r in self.rows:
            columns += [key for key in r if key not in columns]
        tmp = self.path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(self.rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def _header(self) -> list[str] | None:
        if not self.path.exists():
            return None
        with open(self.path, newline="") as f:
            return next(csv.reader(f), None)
