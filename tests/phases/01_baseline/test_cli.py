"""Phase 01's command line, CPU run and report: bad values are argparse errors, a tiny CPU run writes
its rows and a smoke report, the headline compares compile with eager on cuDNN at small."""

import csv
import os
import subprocess
import sys

import pandas as pd
import pytest

from common import ON_GPU
from common.provenance import REPO_ROOT
from common.report import Figures
from phases.__main__ import phase_module


@pytest.mark.parametrize(
    "argv",
    [
        ["--shape", "huge"],
        ["--batch", "0"],
        ["--dtype", "fp8"],
        ["--sdpa-backend", "nope"],
        ["--modes", "jit"],
        ["--steps", "0"],
        ["--warmup", "-1"],
    ],
)
def test_cli_rejects_bad_input_before_work(argv, capsys):
    main = phase_module("01", "__main__")
    with pytest.raises(SystemExit) as err:
        main.parse_args(argv)
    assert err.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.skipif(ON_GPU, reason="the CPU's refusal")
def test_gpu_shapes_are_refused_on_the_cpu(capsys):
    with pytest.raises(SystemExit) as err:
        phase_module("01", "__main__").parse_args(["--shape", "small"])
    assert err.value.code == 2 and "interpreter" in capsys.readouterr().err


@pytest.mark.skipif(ON_GPU, reason="what a machine without a GPU runs")
def test_phase_runs_on_the_cpu_and_writes_rows_and_report(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITONLAB_DATA_DIR"}
    done = subprocess.run(
        [sys.executable, "-m", "phases", "01", "--steps", "1", "--warmup", "0", "--train", "--train-steps", "2",
         "--out", str(tmp_path)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "TRITON_INTERPRET=1" in done.stdout  # it says it is a CPU smoke run
    (csv_path,) = (tmp_path / "data" / "01_baseline").glob("*.csv")
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["variant"] for r in rows] == ["eager+sdpa-math", "train+sdpa-math", "train+sdpa-math"]
    assert rows[0]["status"] == "ok" and float(rows[0]["step_ms"]) > 0 and rows[0]["tokens"] == "96"
    assert rows[-1]["step"] == "2" and float(rows[-1]["train_loss"]) > 0
    assert "CPU smoke runs" in (tmp_path / "01_baseline.md").read_text()


def step_rows() -> pd.DataFrame:
    rows = []
    for variant, ms in (("eager+sdpa-cudnn", 90.0), ("eager+sdpa-flash", 91.0), ("compile+sdpa-cudnn", 30.0)):
        rows.append(
            {"gpu": "NVIDIA H100 80GB HBM3", "variant": variant, "shape": "small", "dtype": "bf16", "status": "ok",
             "error": "", "batch": 64, "step_ms": ms, "tokens_per_s": 36096 / ms * 1e3, "forward_ms": ms / 3,
             "backward_ms": ms / 1.5, "optimizer_ms": 0.4, "peak_mem_gb": 10.0, "utc": "2026-11-21T19:43:15Z",
             "run_group": "g1"}
        )  # fmt: skip
    for step, loss in ((10, 2.0), (20, 1.5)):
        rows.append(
            {"gpu": "NVIDIA H100 80GB HBM3", "variant": "train+sdpa-cudnn", "shape": "small", "dtype": "bf16",
             "status": "ok", "error": "", "step": step, "train_loss": loss, "utc": "2026-11-21T19:50:00Z",
             "run_group": "g1"}
        )  # fmt: skip
    return pd.DataFrame(rows)


def test_headline_and_render(tmp_path):
    report = phase_module("01", "report")
    (verdict,) = report.headline(step_rows())
    assert verdict.ours == "compile+sdpa-cudnn" and verdict.baseline == "eager+sdpa-cudnn"
    assert abs(verdict.ratio - 3.0) < 1e-9 and verdict.verdict() == "no goal"
    text = report.render(step_rows(), Figures("01_baseline", tmp_path, "NVIDIA H100 80GB HBM3"))
    assert "speedup_vs_eager_cudnn" in text and "Loss from 2.000" in text
    assert (
        report.REPORT.title
        == (REPO_ROOT / "phases" / "01_baseline" / "README.md").read_text().splitlines()[0][2:]
    )
