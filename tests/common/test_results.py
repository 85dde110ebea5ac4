"""Result rows: provenance on every row, atomic appends, new columns, unique run files."""

import csv
import os
import subprocess
import sys

from common import ResultWriter, failure_row
from common.memory import OutOfMemory
from common.provenance import provenance

# Written out, not read from provenance(): the test also catches a column it stops writing.
PROVENANCE_KEYS = {
    "gpu",
    "sm_count",
    "torch",
    "triton",
    "cuda",
    "cudnn",
    "git_commit",
    "git_dirty",
    "host",
    "utc",
    "slurm_job_id",
    "slurm_array_job_id",
    "slurm_array_task_id",
}


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_every_row_carries_provenance_and_keys():
    writer = ResultWriter("unit")
    writer.write({"variant": "a", "shape": "tiny", "dtype": "fp32", "ms": 1.5})
    (row,) = read_rows(writer.path)
    assert set(row) >= PROVENANCE_KEYS
    assert row["phase"] == "unit" and row["status"] == "ok" and row["ms"] == "1.5"
    assert row["run_id"] == writer.run_id and row["run_group"] == writer.run_id
    assert row["torch"] and row["triton"] and row["git_commit"]


def test_rows_are_appended_and_new_columns_extend_the_header():
    writer = ResultWriter("unit")
    writer.write({"variant": "a", "ms": 1.0})
    writer.write({"variant": "b", "ms": 2.0})
    writer.write({"variant": "c", "ms": 3.0, "extra": "x"})
    rows = read_rows(writer.path)
    assert [r["variant"] for r in rows] == ["a", "b", "c"]
    assert rows[0]["extra"] == "" and rows[2]["extra"] == "x"
    assert not writer.path.with_suffix(".csv.tmp").exists()


def test_each_row_is_on_disk_before_the_next_measurement(tmp_path):
    """A run killed after its first row keeps that row."""
    script = (
        "import os, common\n"
        "w = common.ResultWriter('killed')\n"
        "w.write({'variant': 'first', 'ms': 1.0})\n"
        "os._exit(9)\n"
    )
    env = {**os.environ, "TRITONLAB_DATA_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=os.getcwd())
    assert done.returncode == 9
    (path,) = (tmp_path / "killed").glob("*.csv")
    assert [r["variant"] for r in read_rows(path)] == ["first"]


def test_concurrent_writers_never_share_a_file(monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "77")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    a, b = ResultWriter("unit"), ResultWriter("unit", run_id="other")
    assert a.path != b.path
    assert "a77_3" in a.run_id
    assert a.run_group == "77"  # array tasks are one run for speedups
    assert provenance()["slurm_array_task_id"] == "3"


def test_failure_rows_tell_oom_from_errors():
    assert failure_row(OutOfMemory("CUDA out of memory"))["status"] == "oom"
    row = failure_row(ValueError("bad shape"))
    assert row["status"] == "error" and "bad shape" in row["error"]


def test_two_writers_in_one_second_get_their_own_files():
    a, b = ResultWriter("unit"), ResultWriter("unit")
    a.write({"variant": "a", "ms": 1.0})
    b.write({"variant": "b", "other": 2.0})
    assert a.path != b.path
    assert [r["variant"] for r in read_rows(a.path)] == ["a"]
