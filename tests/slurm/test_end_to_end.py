"""`sbatch slurm/run_matrix.sbatch` on a real local Slurm cluster, CPU matrix, tiny shape.

Submits the real template (GPU request included: the local node has fake GPUs), waits for the
launcher, the array and the collector, then checks what a user would look at: a CSV row for every
cell carrying its Slurm ids, every log, and the report the collector re-rendered.
"""

import csv
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm.matrix import BASELINE_PHASE, PHASE, cells

from .conftest import job_env

pytestmark = pytest.mark.slurm

TIMEOUT_S = 240


def launch_matrix(
    cluster, checkout: Path, env: dict, command: list[str], cancel_task: int | None = None
) -> dict:
    """Launch the matrix as a user would -- `sbatch slurm/run_matrix.sbatch` (a launcher job) or
    `just slurm-matrix` (launched right here) -- optionally cancel one task while it waits, and
    wait until the queue is empty; returns the job ids."""
    out = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{command} failed:\n{out.stdout}\n{out.stderr}"
    launched = out.stdout
    if command[0] == "sbatch":
        launcher = re.search(r"Submitted batch job (\d+)", out.stdout)[1]
        launcher_log = checkout / "reports" / "logs" / f"tritonlab-matrix-{launcher}.out"
        deadline = time.monotonic() + 60
        while not (launcher_log.exists() and "collector job" in launcher_log.read_text()):
            if time.monotonic() > deadline or not cluster.run("squeue", "-h", "-o", "%i").stdout.strip():
                pytest.fail(f"the launcher did not submit the array\n{all_logs(checkout)}\n{cluster.logs()}")
            time.sleep(0.2)
        launched = launcher_log.read_text()
    found = re.search(r"array job (\d+) .* collector job (\d+)", launched)
    assert found, f"no array and collector job in:\n{launched}"
    jobs = {"array": found[1], "collector": found[2]}
    if cancel_task is not None:
        task = f"{jobs['array']}_{cancel_task}"
        state = cluster.run("squeue", "-h", "-r", "-j", task, "-o", "%T").stdout.strip()
        assert state == "PENDING", f"task {task} should still be waiting for a CPU, not {state!r}"
        cluster.run("scancel", task)
    wait_for_empty_queue(cluster, checkout)
    return jobs


def just_command() -> str:
    just = shutil.which("just") or str(Path(sys.prefix) / "bin" / "just")
    if not Path(just).exists():
        pytest.skip("`just` is not installed (uv sync installs it with the dev group)")
    return just


def wait_for_empty_queue(cluster, checkout: Path) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while cluster.run("squeue", "-h", "-o", "%i").stdout.strip():
        if time.monotonic() > deadline:
            pytest.fail(
                f"jobs still queued after {TIMEOUT_S} s:\n{cluster.run('squeue').stdout}\n"
                f"{all_logs(checkout)}\n{cluster.logs()}"
            )
        time.sleep(0.5)


def job_field(cluster, job: str, field: str = "JobState") -> str:
    out = cluster.run("scontrol", "show", "job", "-o", job).stdout
    return re.search(rf"\b{re.escape(field)}=(\S*)", out)[1]


def job_state(cluster, job: str) -> str:
    return job_field(cluster, job, "JobState")


def all_logs(checkout: Path) -> str:
    logs = sorted((checkout / "reports" / "logs").glob("*.out"))
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs)


def read_rows(checkout: Path) -> list[dict]:
    rows = []
    for path in sorted((checkout / "out" / "cpu" / "data" / PHASE).glob("*.csv")):
        with open(path, newline="") as f:
            rows += list(csv.DictReader(f))
    return rows


def check_cell_rows(rows: list[dict], matrix, jobs: dict) -> dict[str, dict]:
    """Exactly one row per variant of every cell, from that cell's array task; returns them by variant.
    (The checkout may hold rows of earlier runs, committed ones: those are left alone.)"""
    rows = [r for r in rows if r["slurm_array_job_id"] == jobs["array"]]
    by_variant = {}
    for index, cell in enumerate(matrix):
        for expected in cell.expected_rows():
            found = [
                r for r in rows if r["variant"] == expected["variant"] and r["shape"] == expected["shape"]
            ]
            assert len(found) == 1, f"cell {index} {expected['variant']}: {len(found)} rows"
            row = found[0]
            assert row["slurm_array_job_id"] == jobs["array"], row
            assert row["slurm_array_task_id"] == str(index), row
            assert row["run_group"] == jobs["array"], "a matrix's cells must form one run group"
            assert row["slurm_job_id"], row
            assert row["phase"] == PHASE and row["dtype"] == expected["dtype"]
            by_variant[row["variant"]] = row
    assert len(rows) == len(by_variant), "rows that belong to no cell"
    return by_variant


def test_matrix_writes_a_row_per_cell_and_the_report(cluster, checkout):
    env = job_env(cluster, TRITONLAB_MATRIX="cpu")
    matrix = cells(env)
    assert len(matrix) >= 2
    jobs = launch_matrix(cluster, checkout, env, ["sbatch", "--time=00:30:00", "slurm/run_matrix.sbatch"])
    logs = all_logs(checkout)

    assert job_state(cluster, jobs["collector"]) == "COMPLETED", logs
    for index in range(len(matrix)):
        assert job_state(cluster, f"{jobs['array']}_{index}") == "COMPLETED", logs
        # The launcher job passed on what it was given: the time flag and the template's GPU request.
        assert job_field(cluster, f"{jobs['array']}_{index}", "TimeLimit") == "00:30:00"
        assert job_field(cluster, f"{jobs['array']}_{index}", "TresPerNode") == "gres:gpu:1"
        assert (checkout / "reports" / "logs" / f"tritonlab-matrix-{jobs['array']}_{index}.out").exists()
    rows = check_cell_rows(read_rows(checkout), matrix, jobs)
    for row in rows.values():
        assert row["status"] == "ok", row
        assert float(row["step_ms"]) > 0 and float(row["tokens_per_s"]) > 0, row

    report = checkout / "out" / "cpu" / f"{PHASE}.md"
    collector_log = (checkout / "reports" / "logs" / f"tritonlab-collect-{jobs['collector']}.out").read_text()
    assert f"report: {report}" in collector_log, collector_log
    text = report.read_text()
    for variant in rows:
        assert variant in text, f"{variant} missing from the report:\n{text}"
    assert (checkout / "reports" / "README.md").exists()

    # The same cell run directly, without Slurm, writes rows and a report of the same form.
    before = set((checkout / "out" / "cpu" / "data" / PHASE).glob("*.csv"))
    direct = subprocess.run(
        [sys.executable, "-m", "phases", *matrix[0].argv],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert direct.returncode == 0, direct.stderr[-3000:]
    (direct_csv,) = set((checkout / "out" / "cpu" / "data" / PHASE).glob("*.csv")) - before
    slurm_csv = next((checkout / "out" / "cpu" / "data" / PHASE).glob(f"*-a{jobs['array']}_0.csv"))
    with open(direct_csv, newline="") as f, open(slurm_csv, newline="") as g:
        assert next(csv.reader(f)) == next(csv.reader(g))
    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert [line for line in report.read_text().splitlines() if line.startswith("#")] == headings


def test_a_failed_cell_becomes_a_failure_row(cluster, checkout):
    # sdpa-math runs; sdpa-cudnn has no CPU kernel, so phase 12 records a skipped row itself; the
    # unknown variant kills the phase process before it writes anything, so its array task records
    # it; the last cell is cancelled while it waits for a CPU, so only the collector can record it.
    variants = "sdpa-math sdpa-cudnn no-such-variant custom-bf16-separate"
    env = job_env(cluster, TRITONLAB_MATRIX="cpu", TRITONLAB_MATRIX_VARIANTS=variants)
    matrix = cells(env)
    command = [just_command(), "slurm-matrix", "--time=00:20:00", "-p", "debug"]
    jobs = launch_matrix(cluster, checkout, env, command, cancel_task=3)
    logs = all_logs(checkout)

    assert job_state(cluster, jobs["collector"]) == "COMPLETED", logs
    assert job_state(cluster, f"{jobs['array']}_2") == "FAILED", "a dead cell's task must fail in Slurm too"
    # The flags given to `just slurm-matrix` reach the array, and the placement ones the collector.
    assert job_field(cluster, f"{jobs['array']}_0", "TimeLimit") == "00:20:00"
    assert job_field(cluster, f"{jobs['array']}_0", "TresPerNode") == "gres:gpu:1"
    assert job_field(cluster, jobs["collector"], "Partition") == "debug"
    assert "gpu" not in cluster.run("scontrol", "show", "job", "-o", jobs["collector"]).stdout, (
        "collector: no GPU"
    )

    rows = check_cell_rows(read_rows(checkout), matrix, jobs)
    assert rows["sdpa-math"]["status"] == "ok"
    assert float(rows["sdpa-math"]["step_ms"]) > 0
    assert rows["sdpa-cudnn"]["status"] == "skipped"
    assert rows["sdpa-cudnn"]["error"]
    dead = rows["no-such-variant"]
    assert dead["status"] == "error"
    assert "exit code 2" in dead["error"] and "no-such-variant" in dead["error"], dead["error"]
    # Slurm forgets a task cancelled before it started: the collector says it has no record of it.
    cancelled = rows["custom-bf16-separate"]
    assert cancelled["status"] == "error", cancelled
    assert cancelled["error"].startswith(f"array task {jobs['array']}_3 wrote no row"), cancelled["error"]

    text = (checkout / "out" / "cpu" / f"{PHASE}.md").read_text()
    assert "Cells that did not finish" in text, text
    for variant in rows:
        assert variant in text, f"{variant} missing from the report:\n{text}"


def test_phase_job_both_ways_of_submitting(cluster, checkout):
    """`just slurm-phase 01 ...` (positional arguments) and `sbatch --export=...,PHASE,ARGS`."""
    just = just_command()
    env = job_env(cluster)
    args = ["--shape", "tiny", "--sdpa-backend", "math", "--modes", "eager", "--steps", "1", "--warmup", "0"]
    by_just = subprocess.run(
        [just, "slurm-phase", "01", *args], cwd=checkout, env=env, capture_output=True, text=True, timeout=30
    )
    assert by_just.returncode == 0, by_just.stderr
    by_export = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--export=ALL,PHASE=01_baseline,ARGS={' '.join(args)}",
            "slurm/phase.sbatch",
        ],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert by_export.returncode == 0, by_export.stderr
    jobs = {
        re.search(r"Submitted batch job (\d+)", by_just.stdout)[1]: "tritonlab-01",
        by_export.stdout.strip().split(";")[0]: "tritonlab-phase",
    }
    wait_for_empty_queue(cluster, checkout)

    for job, name in jobs.items():
        log = checkout / "reports" / "logs" / f"{name}-{job}.out"
        assert job_state(cluster, job) == "COMPLETED", all_logs(checkout)
        assert "rows: " in log.read_text(), log.read_text()
        (csv_path,) = (checkout / "out" / "cpu" / "data" / BASELINE_PHASE).glob(f"*-j{job}.csv")
        with open(csv_path, newline="") as f:
            (row,) = csv.DictReader(f)
        assert (row["variant"], row["status"], row["slurm_job_id"], row["slurm_array_job_id"]) == (
            "eager+sdpa-math",
            "ok",
            job,
            "",
        )
    assert "eager+sdpa-math" in (checkout / "out" / "cpu" / f"{BASELINE_PHASE}.md").read_text()
