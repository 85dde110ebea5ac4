"""Phase 02's command line, a tiny run on the CPU, its ncu pass, and its report (the profile too) and
headline from GPU-like rows."""

import pandas as pd
import pytest

from common import ON_GPU
from common.report import Figures
from phases.__main__ import phase_module, run_phase, title
from tritonlab.attention import attention_forward


def gpu_rows(variants_ms: dict, shape="mid", mode="fwd", group="g1", dtype="bf16") -> pd.DataFrame:
    """Rows as the committed CSVs have them (no stored ratio columns)."""
    return pd.DataFrame(
        [
            {"phase": "x", "variant": v, "shape": shape, "dtype": dtype, "status": "ok", "error": "", "mode": mode,
             "batch": 4, "heads": 8, "lq": 11000, "lk": 10000, "head_dim": 64, "ms": ms, "tflops": 400.0,
             "peak_mem_gb": 1.0, "err_o": 1e-3, "config": "BLOCK_M=128" if v.startswith("triton") else "",
             "gpu": "NVIDIA H100 80GB HBM3", "utc": "2026-11-21T23:57:08", "run_group": group}
            for v, ms in variants_ms.items()
        ]
    )  # fmt: skip


def test_help_and_bad_values(capsys):
    for argv, code in ((["--help"], 0), (["--shape", "huge"], 2), (["--dtype", "fp8"], 2)):
        with pytest.raises(SystemExit) as exit_:
            run_phase("02", argv)
        assert exit_.value.code == code, argv
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.skipif(ON_GPU, reason="the CPU's refusals")
def test_cpu_refuses_big_shapes_bf16_and_long_sweeps(capsys):
    for argv, message in (
        (["--shape", "mid"], "too big for Triton's interpreter"),
        (["--dtype", "bf16"], "bf16 dots are wrong"),
        (["--sweep-lk", "5000"], "--sweep-lk: at most"),
    ):
        with pytest.raises(SystemExit) as exit_:
            run_phase("02", argv)
        assert exit_.value.code == 2 and message in capsys.readouterr().err, argv


@pytest.mark.skipif(ON_GPU, reason="CPU smoke run")
def test_tiny_run_writes_rows_with_configs(tmp_path):
    run_phase("02", ["--out", str(tmp_path), "--sweep-lk", "30"])
    rows = pd.concat(pd.read_csv(p) for p in (tmp_path / "data" / "02_attn_fwd").glob("*.csv"))
    assert (rows["status"] == "ok").all(), rows[["variant", "error"]]
    assert set(rows["variant"]) == {"triton", "triton-tma", "triton-blockptr"}
    assert (
        set(rows["shape"]) == {"tiny", "sweep-Lk30"} and rows["config"].str.startswith("interpreter:").all()
    )
    for column in ("mode", "batch", "lq", "lk", "ms", "p20_ms", "tflops", "peak_mem_gb", "err_o", "relerr_o"):
        assert column in rows
    assert "CPU smoke runs" in (tmp_path / "02_attn_fwd.md").read_text()


def test_report_renders_speedups_and_the_headline(tmp_path):
    report = phase_module("02", "report")
    df = pd.concat([
        gpu_rows({"triton": 2.0, "triton-blockptr": 2.1, "sdpa-cudnn": 2.2, "sdpa-flash": 2.9}),
        gpu_rows({"triton": 190.0, "sdpa-cudnn": 208.0, "sdpa-flash": 270.0}, shape="large"),
    ])  # fmt: skip
    text = report.REPORT.render(df, Figures("02_attn_fwd", tmp_path, "H100"))
    assert "speedup_vs_sdpa_cudnn" in text and "speedup_vs_sdpa_flash" in text and "| 1.1 " in text
    verdicts = {v.cell: v for v in report.headline(df)}
    mid = verdicts["mid, fwd, bf16"]
    assert mid.ours == "triton" and mid.baseline == "sdpa-cudnn" and mid.ratio == pytest.approx(1.1)
    assert mid.verdict() == "met" and verdicts["large, fwd, bf16"].verdict() == "missed by 0.5%"
    assert report.REPORT.title == title("02_attn_fwd")


def test_report_shows_the_other_head_dims_shapes(tmp_path):
    """A --head-dim 128 run's rows (mid-d128) appear in the shapes table beside the model's, with
    their speedups over cuDNN."""
    report = phase_module("02", "report")
    df = pd.concat([
        gpu_rows({"triton": 2.0, "sdpa-cudnn": 2.2}),
        gpu_rows({"triton": 1.6, "sdpa-cudnn": 2.0}, shape="mid-d128", group="g2"),
    ])  # fmt: skip
    text = report.REPORT.render(df, Figures("02_attn_fwd", tmp_path, "H100"))
    shapes_table = text.split("TransformerNP shapes")[1].split("\n## ")[0]
    d128 = [line for line in shapes_table.splitlines() if "| mid-d128 " in line]
    assert len(d128) == 2 and any("| 1.25 " in line for line in d128), shapes_table


def test_ncu_pass_needs_a_gpu_then_profiles_cudnn_and_the_forward(attention_ncu_calls):
    calls = attention_ncu_calls("02", backward=False)
    assert list(calls) == ["sdpa-cudnn", "triton"] and calls["triton"] is attention_forward


def test_report_shows_the_ncu_profile_or_says_there_is_none(tmp_path, ncu_profile):
    report = phase_module("02", "report")
    df = gpu_rows({"triton": 2.0, "sdpa-cudnn": 2.2})
    fig = Figures("02_attn_fwd", tmp_path, "H100")
    ncu_profile.check_report(report, df, fig, "02_attn_fwd", ["triton"])
