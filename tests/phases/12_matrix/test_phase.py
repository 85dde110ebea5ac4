"""Phase 12's command line, CPU run and report: an unknown variant is an argparse error, a tiny run
writes one row per variant (ok, or skipped with its reason), a wrong gradient is an error, and the
report opens with a verdict per shape from GPU-like rows."""

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
    [["--variants", "nope"], ["--checkpoint", "sometimes"], ["--graphs", "maybe"], ["--shape", "huge"],
     ["--steps", "0"], ["--loss-steps", "-1"]],
)  # fmt: skip
def test_cli_rejects_bad_input_before_work(argv, capsys):
    main = phase_module("12", "__main__")
    with pytest.raises(SystemExit) as err:
        main.parse_args(argv)
    assert err.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_graphs_default_to_both_at_small_and_off_elsewhere_unless_asked():
    main = phase_module("12", "__main__")
    args = main.parse_args(["--shape", "tiny"])
    assert args.graphs is None
    assert main.graph_toggles(args, "small") == [False, True]
    assert main.graph_toggles(args, "mid") == main.graph_toggles(args, "tiny") == [False]
    asked = main.parse_args(["--shape", "tiny", "--graphs", "on", "on"])
    assert main.graph_toggles(asked, "small") == main.graph_toggles(asked, "mid") == [True]


@pytest.mark.skipif(ON_GPU, reason="what a machine without a GPU runs")
def test_a_tiny_cpu_run_writes_a_row_per_variant(tmp_path):
    main = phase_module("12", "__main__")
    bench = phase_module("12", "bench")
    main.main(["--out", str(tmp_path), "--steps", "1", "--loss-steps", "2", "--graphs", "off", "on",
               "--variants", "sdpa-math", "sdpa-cudnn", "custom-bf16-separate", "custom-fp8-fused",
               "compile+custom-bf16-fused"])  # fmt: skip
    (csv_path,) = (tmp_path / "data" / "12_matrix").glob("*.csv")
    with open(csv_path, newline="") as f:
        rows = {r["variant"]: r for r in csv.DictReader(f)}
    assert len(rows) == 10
    ref = rows["sdpa-math"]
    assert ref["status"] == "ok" and float(ref["step_ms"]) > 0 and float(ref["speedup_vs_best_baseline"]) == 1
    ours = rows["custom-bf16-separate"]
    assert ours["status"] == "ok", ours["error"]
    assert float(ours["grad_max_rel_err"]) <= bench.TOLERANCES["fp32"]["grad_rtol"]
    assert len(ours["loss_curve"].split(";")) == 2 and float(ours["tokens_per_s"]) > 0
    assert float(ours["speedup_vs_best_baseline"]) > 0
    assert "FP8 attention needs compute capability >= 8.9" in rows["custom-fp8-fused"]["error"]
    assert rows["custom-fp8-fused"]["status"] == "skipped"
    assert "needs a CUDA GPU" in rows["sdpa-cudnn"]["error"]
    assert "CUDA graphs need a CUDA GPU" in rows["custom-bf16-separate+graphs"]["error"]
    assert rows["compile+custom-bf16-fused"]["status"] == "skipped"
    text = (tmp_path / "12_matrix.md").read_text()
    assert "CPU smoke runs" in text and "## Verdict" not in text


def test_the_fp8_variant_is_our_components_with_phase_05s_attention_forced_to_fp8():
    from tritonlab.attention import fp8_attention

    bench = phase_module("12", "bench")
    attention = bench.components("custom-fp8-fused").attention
    assert attention.func is fp8_attention and attention.keywords == {"force_fp8": True}
    assert bench.components("custom-bf16-separate").mlp is bench.components("custom-fp8-fused").mlp


def test_a_wrong_gradient_is_an_error():
    bench = phase_module("12", "bench")
    ref = bench.Grads(2.0, {"w": torch.ones(10), "b": torch.ones(3)})
    ok = bench.compare(bench.Grads(2.0, {"w": torch.ones(10) * (1 + 1e-5), "b": torch.ones(3)}), ref, "fp32")
    assert ok["grad_max_rel_err"] < 1e-4
    with pytest.raises(AssertionError, match="w: grad rel err"):
        bench.compare(bench.Grads(2.0, {"w": torch.ones(10) * 1.5, "b": torch.ones(3)}), ref, "bf16")
    with pytest.raises(AssertionError, match="loss rel err"):
        bench.compare(bench.Grads(2.5, dict(ref.grads)), ref, "bf16")


def _gpu_rows() -> pd.DataFrame:
    rows = []

    def add(shape, variant, step_ms, status="ok"):
        tokens = {"small": 64 * 564, "mid": 4 * 11_000}[shape]
        row = {"gpu": GPU, "variant": variant, "base_variant": variant, "shape": shape, "dtype": "bf16",
               "status": status, "error": "" if status == "ok" else "Unsupported: graph break\n  Explanation: | x",
               "checkpoint": "none", "graphs": False, "batch": 64, "tokens": tokens,
               "utc": "2026-11-26T10:00:00Z", "run_group": "g1"}  # fmt: skip
        if status == "ok":
            row.update(step_ms=step_ms, step_p20_ms=step_ms * 0.98, step_p80_ms=step_ms * 1.02,
                       forward_ms=step_ms * 0.3, backward_ms=step_ms * 0.6, optimizer_ms=step_ms * 0.1,
                       tokens_per_s=tokens / step_ms * 1e3, peak_mem_gb=3.0,
                       loss_curve="2.0;1.8;1.5", loss_lowered="")  # fmt: skip
        rows.append(row)

    add("small", "sdpa-cudnn", 90.0)
    add("small", "compile+sdpa-cudnn", 27.6)
    add("small", "sdpa-flash", 91.0)
    add("small", "compile+sdpa-flash", 28.0)
    add("small", "custom-bf16-fused", 20.0)
    add("small", "compile+custom-bf16-fused", None, status="error")
    add("mid", "sdpa-cudnn", 150.0)
    add("mid", "sdpa-flash", 100.0)  # not a goal baseline at mid
    add("mid", "compile+sdpa-cudnn", 117.8)
    add("mid", "custom-bf16-separate", 110.0)
    return pd.DataFrame(rows)


def test_the_report_opens_with_a_verdict_per_shape(tmp_path):
    report = phase_module("12", "report")
    verdicts = {v.cell: v for v in report.headline(_gpu_rows())}
    small = verdicts["fastest custom / best baseline tokens/s, small, bf16"]
    assert small.ours == "custom-bf16-fused" and small.baseline == "compile+sdpa-cudnn"
    assert small.ratio == pytest.approx(27.6 / 20.0) and small.verdict() == "met"
    mid = verdicts["fastest custom / best baseline tokens/s, mid, bf16"]
    assert mid.baseline == "compile+sdpa-cudnn" and mid.ratio == pytest.approx(117.8 / 110.0)
    assert mid.verdict().startswith("missed")
    text = report.render(_gpu_rows(), Figures("12_matrix", tmp_path, GPU))
    first = text.split("## Tokens/s")[0]
    assert "custom-bf16-fused" in first and "1.38×" in first and "≥ 1.2×" in first and "missed" in first
    assert "Cells that did not finish" in text and "Unsupported: graph break Explanation: / x" in text
    # The speedup columns come from the run group's rows: a Slurm task measures one variant alone.
    table = text.split("## Every step measured")[1]
    custom = next(line for line in table.splitlines() if "| custom-bf16-fused " in line)
    assert "| 4.5 " in custom and "| 1.38 " in custom, custom
    assert (tmp_path / "figures" / "12_matrix_tokens_per_s.png").exists()
    assert (tmp_path / "figures" / "12_matrix_stages.png").exists()
    assert (tmp_path / "figures" / "12_matrix_loss_curves.png").exists()
    assert (
        report.REPORT.title
        == (REPO_ROOT / "phases" / "12_matrix" / "README.md").read_text().splitlines()[0][2:]
    )


def test_without_measurements_the_headline_says_not_measured(tmp_path):
    report = phase_module("12", "report")
    rows = _gpu_rows()
    rows = rows.loc[rows["variant"] == "compile+custom-bf16-fused"]
    text = report.render(rows, Figures("12_matrix", tmp_path, GPU))
    assert "not measured" in text.split("## Tokens/s")[0]


def test_a_run_without_a_goal_baseline_has_no_verdict(tmp_path):
    # Eager cuDNN alone beside ours at mid: compile+sdpa-cudnn, which may be the best, did not run.
    report = phase_module("12", "report")
    rows = _gpu_rows()
    rows = rows.loc[(rows["shape"] == "mid") & (rows["variant"] != "compile+sdpa-cudnn")]
    mid = report.headline(rows)[0]
    assert mid.baseline == "sdpa-cudnn (compile+sdpa-cudnn not run)" and mid.verdict() == "not measured"
    text = report.render(rows, Figures("12_matrix", tmp_path, GPU)).split("## Tokens/s")[0]
    assert "1.36×" in text and "no verdict: compile+sdpa-cudnn not run" in text and "met" not in text


def test_graphed_cells_of_every_baseline_give_a_verdict_and_the_gpu_table(tmp_path):
    """A run whose cells are all graphed has every goal baseline (as its graphed cell); profiled rows
    add the GPU's time by kernel family."""
    report = phase_module("12", "report")
    rows = _gpu_rows()
    rows = rows.loc[(rows["shape"] == "small") & (rows["status"] == "ok")].copy()
    rows["graphs"] = True
    rows["variant"] = rows["base_variant"] + "+graphs"
    rows["gpu_busy_ms"] = rows["step_ms"] * 0.9
    rows["gpu_attention_ms"] = 2.5
    rows["gpu_gemm_ms"] = 9.0
    rows["gpu_mlp_ms"] = 0.0  # a family no row ran stays out of the table
    small = report.headline(rows)[0]
    assert small.baseline == "compile+sdpa-cudnn+graphs" and small.ratio == pytest.approx(27.6 / 20.0)
    text = report.render(rows, Figures("12_matrix", tmp_path, GPU))
    gpu = text.split("by kernel family")[1].split("## Loss curves")[0]
    assert "gpu_attention_ms" in gpu and "gpu_gemm_ms" in gpu and "gpu_mlp_ms" not in gpu
    line = next(row for row in gpu.splitlines() if "| custom-bf16-fused+graphs " in row)
    assert "| 18 " in line and "| 10 " in line, line  # busy 0.9 × 20 ms; idle 10%


def test_the_padded_variant_keeps_our_attention_heads_and_loss_and_pads_the_mlp():
    from tritonlab.attention import fused_attention
    from tritonlab.grouped_gemm import gmm_heads
    from tritonlab.mlp import padded_cublas_mlp

    bench = phase_module("12", "bench")
    padded = bench.components("compile+custom-bf16-padded")
    assert padded.attention is fused_attention and padded.mlp is padded_cublas_mlp
    assert padded.heads.func is gmm_heads and padded.heads.keywords == {"save_preactivation": True}
    assert padded.loss is bench.components("custom-bf16-fused").loss


def test_a_run_of_a_few_variants_does_not_hide_the_complete_run(tmp_path, monkeypatch):
    # A later loss check timed the FP8 variant beside eager cuDNN only: the headline stays with the
    # complete run (its compiled baseline beat eager cuDNN), the loss curves show the newest of each.
    report = phase_module("12", "report")
    rows = _gpu_rows()
    later = rows.loc[(rows["shape"] == "small") & rows["variant"].isin(["sdpa-cudnn"])].copy()
    fp8 = later.copy().assign(variant="custom-fp8-fused", base_variant="custom-fp8-fused", step_ms=15.0)
    later = pd.concat([later, fp8]).assign(
        utc="2026-11-27T10:00:00Z", run_group="g2", loss_curve="3.0;2.0;1.0"
    )
    rows = pd.concat([rows, later], ignore_index=True)
    rows["tokens_per_s"] = rows["tokens"] / rows["step_ms"] * 1e3
    small = {v.cell: v for v in report.headline(rows)}["fastest custom / best baseline tokens/s, small, bf16"]
    assert small.ours == "custom-bf16-fused" and small.baseline == "compile+sdpa-cudnn"
    plotted = []
    monkeypatch.setattr(report, "_loss_figure", lambda df, figs: plotted.append(df) or "")
    report.render(rows, Figures("12_matrix", tmp_path, GPU))
    curves = plotted[0].loc[plotted[0]["shape"] == "small"].set_index("variant")
    assert (
        curves.loc["custom-fp8-fused", "run_group"] == "g2" and curves.loc["sdpa-cudnn", "run_group"] == "g2"
    )
    assert curves.loc["compile+sdpa-cudnn", "run_group"] == "g1"


def test_checkpointed_rows_are_reported_against_the_same_variant_without(tmp_path):
    report = phase_module("12", "report")
    rows = _gpu_rows().assign(run_id="r1")
    ckpt = rows.loc[rows["variant"] == "sdpa-cudnn"].copy()
    ckpt = ckpt.assign(variant=ckpt["variant"] + "+ckpt-block", checkpoint="block", run_id="r2",
                       step_ms=ckpt["step_ms"] * 1.3, peak_mem_gb=1.0)  # fmt: skip
    plain = rows.loc[rows["variant"] == "sdpa-cudnn"].assign(run_id="r2")
    text = report.render(pd.concat([rows, plain, ckpt]), Figures("12_matrix", tmp_path, GPU))
    table = text.split("## With activation checkpointing")[1].split("## Every step")[0]
    block = [line for line in table.splitlines() if "| block " in line]
    assert len(block) == 2 and all("| 1.3 " in line and "| 0.3333 " in line for line in block), table
    assert "## With activation checkpointing" not in report.render(rows, Figures("12_matrix", tmp_path, GPU))
