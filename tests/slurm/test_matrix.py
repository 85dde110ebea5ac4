"""slurm.matrix without a cluster: the cells, the array size, forwarded flags, failure rows."""

import csv
import importlib
import subprocess
import sys

import pytest

from common.results import data_dir
from slurm import matrix
from slurm.matrix import (
    BASELINE_PHASE,
    PHASE,
    VARIANTS_12,
    Cell,
    array_range,
    cells,
    forward_flags,
    placement_flags,
    record_missing,
    run_cell,
)

from .conftest import REPO

BASELINE = {"TRITONLAB_MATRIX_PHASE": "01"}


def test_the_default_cpu_matrix_is_phase_12_at_the_tiny_shape_one_task_per_variant():
    cpu = cells({"TRITONLAB_MATRIX": "cpu"})
    assert [(c.phase, c.shape) for c in cpu] == [(PHASE, "tiny")] * 2
    assert [c.expected_rows()[0]["variant"] for c in cpu] == ["sdpa-math", "custom-bf16-separate"]
    assert array_range(cpu) == "0-1"
    assert cpu[1].argv[:11] == [PHASE, "--shape", "tiny", "--variants", "custom-bf16-separate",
                                "--checkpoint", "none", "--graphs", "off", "--dtype", "fp32"]  # fmt: skip


def test_the_default_gpu_matrix_is_every_shape_by_every_variant_of_phase_12_small_graphed_too():
    gpu = cells({})
    assert len(gpu) == 4 * len(VARIANTS_12) and array_range(gpu) == f"0-{4 * len(VARIANTS_12) - 1}"
    assert {c.shape for c in gpu} == {"small", "mid", "large"}
    # small's headline is graphed: each variant with and without a graph there, without elsewhere.
    graphed = {(c.shape, c.expected_rows()[0]["graphs"]) for c in gpu}
    assert graphed == {("small", False), ("small", True), ("mid", False), ("large", False)}
    assert sum(c.expected_rows()[0]["graphs"] for c in gpu) == len(VARIANTS_12)
    assert all("--dtype" in c.argv and c.argv[c.argv.index("--dtype") + 1] == "bf16" for c in gpu)
    # Every variant phase 12 runs on a GPU by default, and nothing else.
    bench = importlib.import_module("phases.12_matrix.bench")
    assert list(VARIANTS_12) == [v for v in bench.VARIANTS if v != "sdpa-math"]
    (row,) = gpu[0].expected_rows()
    assert row == {"variant": "sdpa-cudnn", "shape": "small", "dtype": "bf16", "base_variant": "sdpa-cudnn",
                   "checkpoint": "none", "graphs": False}  # fmt: skip


def test_phase_12_toggles_multiply_the_cells_and_name_their_rows():
    env = {"TRITONLAB_MATRIX_SHAPES": "mid", "TRITONLAB_MATRIX_VARIANTS": "sdpa-cudnn custom-bf16-fused",
           "TRITONLAB_MATRIX_CHECKPOINT": "none,block", "TRITONLAB_MATRIX_GRAPHS": "off on",
           "TRITONLAB_MATRIX_ARGS": "--steps 5"}  # fmt: skip
    chosen = cells(env)
    assert len(chosen) == 2 * 2 * 2
    # TRITONLAB_MATRIX_GRAPHS applies to every shape, small too.
    assert len(cells({**env, "TRITONLAB_MATRIX_SHAPES": "small", "TRITONLAB_MATRIX_GRAPHS": "off"})) == 2 * 2
    assert [c.expected_rows()[0]["variant"] for c in chosen] == [
        "sdpa-cudnn", "custom-bf16-fused", "sdpa-cudnn+graphs", "custom-bf16-fused+graphs",
        "sdpa-cudnn+ckpt-block", "custom-bf16-fused+ckpt-block", "sdpa-cudnn+ckpt-block+graphs",
        "custom-bf16-fused+ckpt-block+graphs",
    ]  # fmt: skip
    assert chosen[-1].argv[-2:] == ["--steps", "5"]


def test_phase_01_keeps_its_matrix_under_its_own_name():
    cpu = cells({**BASELINE, "TRITONLAB_MATRIX": "cpu"})
    assert [(c.phase, c.shape, c.args[1]) for c in cpu] == [
        (BASELINE_PHASE, "tiny", b) for b in ("math", "flash")
    ]
    assert cpu[0].argv[:7] == [
        BASELINE_PHASE,
        "--shape",
        "tiny",
        "--sdpa-backend",
        "math",
        "--modes",
        "eager",
    ]
    gpu = cells(BASELINE)
    assert len(gpu) == 3 * 4 and array_range(gpu) == "0-11"
    assert [r["variant"] for r in gpu[0].expected_rows()] == ["eager+sdpa-cudnn", "compile+sdpa-cudnn"]
    chosen = cells({**BASELINE, "TRITONLAB_MATRIX_SHAPES": "mid,large", "TRITONLAB_MATRIX_BACKENDS": "flash",
                    "TRITONLAB_MATRIX_ARGS": "--steps 20"})  # fmt: skip
    assert [(c.shape, c.args[1]) for c in chosen] == [("mid", "flash"), ("large", "flash")]
    assert chosen[0].argv[-2:] == ["--steps", "20"]


def test_bad_matrix_settings_are_named():
    with pytest.raises(ValueError, match="TRITONLAB_MATRIX: unknown 'tpu'"):
        cells({"TRITONLAB_MATRIX": "tpu"})
    with pytest.raises(ValueError, match="TRITONLAB_MATRIX_ARGS: --modes is set per cell"):
        cells({"TRITONLAB_MATRIX_ARGS": "--steps 3 --modes eager"})
    with pytest.raises(ValueError, match="TRITONLAB_MATRIX_ARGS: --variants=x is set per cell"):
        cells({"TRITONLAB_MATRIX_ARGS": "--variants=x"})
    with pytest.raises(ValueError, match="matrix is empty"):
        array_range([])


def test_entry_point_prints_the_array_range():
    out = subprocess.run(
        [sys.executable, "-m", "slurm.matrix", "array"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"TRITONLAB_MATRIX": "cpu", "PATH": ""},
        check=True,
    )
    assert out.stdout.strip() == "0-1"


# What `scontrol show job -o` printed on Slurm 22.05 for `sbatch --time=5 --gres=gpu:1 ...`.
SCONTROL = (
    "JobId=2 JobName=tritonlab-matrix UserId=root(0) Account=(null) QOS=(null) JobState=RUNNING "
    "TimeLimit=00:05:00 Partition=debug NumCPUs=1 CPUs/Task=1 MinMemoryNode=0 Features=(null) "
    "Reservation=(null) Command=/x/slurm/run_matrix.sbatch TresPerNode=gres:gpu:1"
)


def test_forwarded_flags_reproduce_placement_and_resources():
    flags = forward_flags(SCONTROL)
    assert flags == ["--partition=debug", "--time=00:05:00", "--job-name=tritonlab-matrix", "--gres=gpu:1"]
    assert placement_flags(flags) == ["--partition=debug"]
    custom = SCONTROL.replace("Account=(null)", "Account=proj").replace("CPUs/Task=1", "CPUs/Task=8")
    custom = custom.replace("TresPerNode=gres:gpu:1", "TresPerNode=gres/gpu:h100:2")
    flags = forward_flags(custom)
    assert "--account=proj" in flags and "--cpus-per-task=8" in flags and "--gres=gpu:h100:2" in flags


def test_placement_flags_in_every_spelling():
    given = [
        "-p",
        "gpu",
        "--time=2:00:00",
        "--account",
        "proj",
        "-q",
        "high",
        "--gres=gpu:2",
        "--reservation=r",
    ]
    assert placement_flags(given) == ["--partition=gpu", "--account=proj", "--qos=high", "--reservation=r"]
    out = subprocess.run(
        [sys.executable, "-m", "slurm.matrix", "placement", "--", *given],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == placement_flags(given)


@pytest.fixture
def array_task(monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "77")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    monkeypatch.setenv("SLURM_JOB_ID", "80")


def read_rows(phase: str = BASELINE_PHASE) -> list[dict]:
    rows = []
    for path in sorted((data_dir() / phase).glob("*.csv")):
        with open(path, newline="") as f:
            rows += list(csv.DictReader(f))
    return rows


def test_record_missing_fills_only_the_rows_a_cell_did_not_write(array_task):
    from common import ResultWriter

    (cell,) = cells({**BASELINE, "TRITONLAB_MATRIX_SHAPES": "small", "TRITONLAB_MATRIX_BACKENDS": "flash"})
    ResultWriter(BASELINE_PHASE).write({**cell.expected_rows()[0], "step_ms": 1.5})
    written = record_missing(cell, "phase process ended with exit code 1: boom")
    assert [r["variant"] for r in written] == ["compile+sdpa-flash"]
    assert record_missing(cell, "again") == []  # idempotent: the collector may run after run-cell
    rows = {r["variant"]: r for r in read_rows()}
    assert rows["eager+sdpa-flash"]["status"] == "ok"
    failed = rows["compile+sdpa-flash"]
    assert failed["status"] == "error" and failed["error"].endswith("boom")
    assert (failed["slurm_array_job_id"], failed["slurm_array_task_id"], failed["run_group"]) == (
        "77",
        "3",
        "77",
    )


def test_run_cell_turns_a_dead_phase_process_into_a_failure_row(array_task, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("TRITONLAB_MATRIX", "cpu")
    monkeypatch.setenv("TRITONLAB_MATRIX_VARIANTS", "no-such-variant")
    assert run_cell(0) == 1
    (row,) = read_rows(PHASE)
    assert (row["variant"], row["base_variant"], row["status"]) == (
        "no-such-variant",
        "no-such-variant",
        "error",
    )
    assert "exit code 2" in row["error"] and "no-such-variant" in row["error"]


def test_collect_fills_cells_whose_task_never_ran(array_task, monkeypatch, tmp_path):
    monkeypatch.setenv("TRITONLAB_MATRIX", "cpu")
    monkeypatch.setattr(matrix, "_job_state", lambda job: "TIMEOUT")
    matrix.collect("91")
    rows = read_rows(PHASE)
    assert [(r["variant"], r["slurm_array_task_id"]) for r in rows] == [
        ("sdpa-math", "0"),
        ("custom-bf16-separate", "1"),
    ]
    assert all("Slurm state: TIMEOUT" in r["error"] and r["run_group"] == "91" for r in rows)
    assert (data_dir().parent / f"{PHASE}.md").exists() and (data_dir().parent / "README.md").exists()


def test_log_directory_exists_in_a_clean_clone():
    tracked = subprocess.run(["git", "ls-files", "reports/logs"], cwd=REPO, capture_output=True, text=True)
    assert tracked.stdout.strip(), (
        "reports/logs/ must exist in a fresh clone: Slurm cannot create the directory of "
        "--output=reports/logs/..., and a job whose log cannot be opened dies at launch. "
        "Track reports/logs/.gitkeep (.gitignore: `reports/logs/*` and `!reports/logs/.gitkeep`)."
    )


def test_any_phase_runs_as_a_matrix_one_task_per_shape():
    chosen = cells({"TRITONLAB_MATRIX_PHASE": "06", "TRITONLAB_MATRIX_ARGS": "--no-report"})
    assert [c.argv for c in chosen] == [
        ["06_fused_mlp", "--shape", shape, "--no-report"] for shape in ("small", "mid", "large")
    ]
    assert [c.argv for c in cells({"TRITONLAB_MATRIX_PHASE": "flash2", "TRITONLAB_MATRIX": "cpu"})] == [
        ["flash2", "--shape", "tiny"]
    ]
    with pytest.raises(ValueError, match="TRITONLAB_MATRIX_PHASE: unknown 'nope'"):
        cells({"TRITONLAB_MATRIX_PHASE": "nope"})


def test_a_generic_cell_owes_one_row_at_its_shape(array_task):
    from common import ResultWriter

    cell = Cell("06_fused_mlp", "mid")
    (failed,) = record_missing(cell, "killed")
    assert failed["variant"] == "(every variant)" and failed["phase"] == "06_fused_mlp"
    assert record_missing(cell, "again") == []
    other = Cell("06_fused_mlp", "large")
    ResultWriter("06_fused_mlp").write({"variant": "eager", "shape": "large", "ms": 1.0})
    assert record_missing(other, "x") == []
