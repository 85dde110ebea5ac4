"""Phase 10's command line, CPU run, validation rule and report: bad values are argparse errors, a tiny
run writes a plain row and a "skipped" graphed row, the check tells bitwise from tolerance from wrong,
and the report opens with a verdict per shape from GPU-like rows."""

import csv

import pandas as pd
import pytest
import torch

from common import ON_GPU
from common.provenance import REPO_ROOT
from common.report import Figures
from phases.__main__ import phase_module

GPU = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(
    "argv",
    [
        ["--components", "nope"],
        ["--shape", "huge"],
        ["--dtype", "fp8"],
        ["--batch", "0"],
        ["--steps", "0"],
        ["--warmup", "0"],
        ["--check-steps", "0"],
    ],
)
def test_cli_rejects_bad_input_before_work(argv, capsys):
    main = phase_module("10", "__main__")
    with pytest.raises(SystemExit) as err:
        main.parse_args(argv)
    assert err.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.skipif(ON_GPU, reason="the CPU's limits")
def test_the_cpu_refuses_gpu_components_and_bf16_triton(capsys):
    main = phase_module("10", "__main__")
    for argv in (["--components", "triton"], ["--components", "sdpa-cudnn"], ["--shape", "small"]):
        with pytest.raises(SystemExit) as err:
            main.parse_args(argv)
        assert err.value.code == 2
    assert main.parse_args(["--components", "triton", "--dtype", "fp32"]).components == ["triton"]
    assert main.parse_args([]).components == ["sdpa-math"]


def _rows(path) -> list[dict]:
    (csv_path,) = path.glob("*.csv")
    with open(csv_path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.skipif(ON_GPU, reason="what a machine without a GPU runs")
def test_a_tiny_cpu_run_writes_a_plain_row_and_a_skipped_graphed_row(tmp_path):
    main = phase_module("10", "__main__")
    main.main(["--out", str(tmp_path), "--steps", "1", "--check-steps", "2"])
    plain, graphed = _rows(tmp_path / "data" / "10_cuda_graphs")
    assert (plain["variant"], plain["status"], plain["graph"]) == ("plain+sdpa-math", "ok", "plain")
    assert plain["tokens"] == "96" and float(plain["step_ms"]) > 0 and float(plain["tokens_per_s"]) > 0
    assert plain["deterministic"] == "True" and float(plain["max_param_diff"]) == 0.0  # CPU: reproducible
    assert (graphed["variant"], graphed["status"]) == ("graphed+sdpa-math", "skipped")
    assert "CUDA graphs need a CUDA GPU" in graphed["error"]
    text = (tmp_path / "10_cuda_graphs.md").read_text()
    assert "CPU smoke runs" in text and "## Verdict" not in text


def _run(losses, params, start):
    bench = phase_module("10", "bench")
    return bench.Run(losses, start, params)


def test_the_validation_tells_bitwise_from_tolerance_from_wrong():
    bench = phase_module("10", "bench")
    torch.manual_seed(0)
    start = [torch.randn(100), torch.randn(10, 10)]
    ref = _run([2.0, 1.9], [p + 1e-3 * torch.randn_like(p) for p in start], start)
    same = bench.compare(_run(list(ref.losses), [p.clone() for p in ref.params], start), ref)
    assert same["bitwise"] and same["max_param_diff"] == 0 and bench.judge(same, same) == "bitwise"
    noisy = _run([2.0, 1.9 + 1e-4], [p + 1e-6 * torch.randn_like(p) for p in ref.params], start)
    close = bench.compare(noisy, ref)
    assert not close["bitwise"] and 0 < close["max_param_diff"] < 1e-5 and close["update_rel_diff"] < 0.1
    assert bench.judge(close, close).startswith("within tolerance (the plain step is not bitwise")
    assert bench.judge(close, same) == "within tolerance, NOT bitwise although the plain step is"
    stale = bench.compare(
        _run([2.0, 2.0], [p.clone() for p in start], start), ref
    )  # the update never applied
    assert stale["update_rel_diff"] == pytest.approx(1.0)
    with pytest.raises(AssertionError, match="validation: the graphed step disagrees"):
        bench.judge(stale, same)


def _gpu_rows() -> pd.DataFrame:
    rows = []

    def add(shape, components, graph, step_ms, status="ok", **extra):
        tokens = {"small": 64 * 564, "mid": 4 * 11_000}[shape]
        row = {"gpu": GPU, "variant": f"{graph}+{components}", "shape": shape, "dtype": "bf16", "status": status,
               "error": "" if status == "ok" else "GraphCaptureError: cannot capture", "graph": graph,
               "components": components, "batch": 64 if shape == "small" else 4, "tokens": tokens,
               "check_steps": 5, "utc": "2026-11-26T10:00:00Z", "run_group": "g1"}  # fmt: skip
        if status == "ok":
            row.update(step_ms=step_ms, step_p20_ms=step_ms * 0.98, step_p80_ms=step_ms * 1.02,
                       tokens_per_s=tokens / step_ms * 1e3, peak_mem_gb=3.0, max_param_diff=0.0,
                       loss_max_diff=0.0, update_rel_diff=0.0,
                       validation="bitwise" if graph == "graphed" else "reference")  # fmt: skip
        rows.append({**row, **extra})

    add("small", "sdpa-cudnn", "plain", 90.0)
    add("small", "sdpa-cudnn", "graphed", 30.0, speedup_vs_plain=3.0)
    add("small", "triton", "plain", 60.0)
    add("small", "triton", "graphed", 55.0, speedup_vs_plain=60 / 55)
    add("mid", "sdpa-cudnn", "plain", 150.0)
    add("mid", "sdpa-cudnn", "graphed", 140.0, speedup_vs_plain=150 / 140)
    add("mid", "triton", "plain", 120.0)
    add("mid", "triton", "graphed", None, status="error")
    return pd.DataFrame(rows)


def test_the_report_opens_with_a_verdict_per_shape(tmp_path):
    report = phase_module("10", "report")
    verdicts = {v.cell: v for v in report.headline(_gpu_rows())}
    small = verdicts["graphed / plain training step, small, sdpa-cudnn, bf16"]
    assert small.ratio == pytest.approx(3.0) and small.goal == 1.2 and small.verdict() == "met"
    missed = verdicts["graphed / plain training step, small, triton, bf16"]
    assert missed.verdict().startswith("missed")
    mid = verdicts["graphed / plain training step, mid, sdpa-cudnn, bf16"]
    assert mid.goal is None and mid.verdict() == "no goal"
    assert len(verdicts) == 3  # mid triton's graphed cell failed: no verdict
    text = report.render(_gpu_rows(), Figures("10_cuda_graphs", tmp_path, GPU))
    first = text.split("## Every step measured")[0]
    assert "**small** (sdpa-cudnn, bf16): **the graph pays**" in first and "3.00×" in first
    assert "**small** (triton, bf16): **the graph misses its 1.2× goal**" in first
    assert "**mid** (sdpa-cudnn, bf16): **the graph is faster**" in first
    assert "**mid** (triton, bf16): the graphed step did not run (error: GraphCaptureError" in first
    assert "Validation over 5 steps: bitwise" in first
    assert "Cells that did not finish" in text and "speedup_vs_plain" in text
    assert (
        report.REPORT.title
        == (REPO_ROOT / "phases" / "10_cuda_graphs" / "README.md").read_text().splitlines()[0][2:]
    )
