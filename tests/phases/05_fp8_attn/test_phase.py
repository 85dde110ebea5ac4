"""Phase 05's command line, a tiny run of the FP8 kernels on the CPU, and its report and headline
from GPU-like rows."""

import pandas as pd
import pytest

from common import ON_GPU
from common.report import Figures
from phases.__main__ import phase_module, run_phase, title
from tritonlab.attention import attention_forward, fp8_attention_forward


def gpu_rows(variants_ms: dict, shape="mid", mode="fwd", group="g1") -> pd.DataFrame:
    """Rows as a GPU run writes them (no stored ratio columns)."""
    return pd.DataFrame(
        [
            {"phase": "05_fp8_attn", "variant": v, "shape": shape, "dtype": "bf16", "status": "ok", "error": "",
             "mode": mode, "batch": 4, "heads": 8, "lq": 11000, "lk": 10000, "head_dim": 64, "ms": ms,
             "tflops": 400.0, "peak_mem_gb": 1.0, "err_o": 0.05 if v == "triton-fp8" else 1e-3,
             "frob_o": 0.04 if v == "triton-fp8" else 3e-3, "config": "BLOCK_M=128" if v.startswith("triton") else "",
             "gpu": "NVIDIA H100 80GB HBM3", "utc": "2026-11-26T10:00:00", "run_group": group}
            for v, ms in variants_ms.items()
        ]
    )  # fmt: skip


def test_help_and_bad_values(capsys):
    for argv, code in (
        (["--help"], 0),
        (["--shape", "huge"], 2),
        (["--dtype", "fp32"], 2),
        (["--mode", "bwd"], 2),
        (["--head-dim", "96"], 2),
    ):
        with pytest.raises(SystemExit) as exit_:
            run_phase("05", argv)
        assert exit_.value.code == code, argv
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.skipif(ON_GPU, reason="the CPU's refusals")
def test_cpu_refuses_big_shapes_and_bf16(capsys):
    for argv, message in (
        (["--shape", "mid"], "too big for Triton's interpreter"),
        (["--dtype", "bf16"], "bf16 dots are wrong"),
    ):
        with pytest.raises(SystemExit) as exit_:
            run_phase("05", argv)
        assert exit_.value.code == 2 and message in capsys.readouterr().err, argv


@pytest.mark.skipif(ON_GPU, reason="CPU smoke run")
def test_tiny_run_checks_and_times_the_fp8_kernels_with_their_errors(tmp_path, capsys):
    run_phase("05", ["--out", str(tmp_path), "--mode", "fwd+bwd"])
    assert "running on the CPU with TRITON_INTERPRET=1" in capsys.readouterr().out
    rows = pd.concat(pd.read_csv(p) for p in (tmp_path / "data" / "05_fp8_attn").glob("*.csv"))
    assert (rows["status"] == "ok").all(), rows[["variant", "error"]]
    assert set(rows["variant"]) == {"triton-fp8", "triton-2pass", "triton-fused"}
    assert set(rows["mode"]) == {"fwd+bwd"}
    fp8, bf16 = (rows.loc[rows["variant"] == v].iloc[0] for v in ("triton-fp8", "triton-2pass"))
    for name in ("o", "dq", "dk", "dv"):
        assert 0 < bf16[f"frob_{name}"] < fp8[f"frob_{name}"] < 0.08, (
            name
        )  # FP8 costs accuracy, within bounds
    assert fp8["config"].startswith("interpreter:") and fp8["dq_config"].startswith("interpreter:")
    assert "CPU smoke runs" in (tmp_path / "05_fp8_attn.md").read_text()


@pytest.mark.skipif(ON_GPU, reason="CPU smoke run")
def test_head_dim_128_keeps_the_width_and_names_its_shapes(tmp_path):
    run_phase("05", ["--out", str(tmp_path), "--mode", "fwd", "--head-dim", "128"])
    rows = pd.concat(pd.read_csv(p) for p in (tmp_path / "data" / "05_fp8_attn").glob("*.csv"))
    assert (rows["status"] == "ok").all(), rows[["variant", "error"]]
    assert (
        set(rows["shape"]) == {"tiny-d128"} and set(rows["head_dim"]) == {128} and set(rows["heads"]) == {4}
    )


def test_report_renders_the_bf16_comparison_and_the_headline(tmp_path):
    report = phase_module("05", "report")
    df = pd.concat([
        gpu_rows({"triton-fp8": 1.3, "triton": 2.0, "sdpa-cudnn": 2.2, "sdpa-flash": 2.9}),
        gpu_rows({"triton-fp8": 140.0, "triton": 186.0, "sdpa-cudnn": 200.0}, shape="large"),
        gpu_rows({"triton-fp8": 6.0, "triton-2pass": 7.0, "sdpa-cudnn": 6.3}, mode="fwd+bwd"),
    ])  # fmt: skip
    text = report.REPORT.render(df, Figures("05_fp8_attn", tmp_path, "H100"))
    assert "FP8 against our bf16 attention" in text and "speedup_vs_ours_bf16" in text and "frob_o" in text
    verdicts = {v.cell: v for v in report.headline(df)}
    mid = verdicts["mid, fwd, bf16"]
    assert mid.baseline == "sdpa-cudnn" and mid.ratio == pytest.approx(2.2 / 1.3) and mid.verdict() == "met"
    assert verdicts["large, fwd, bf16"].verdict() == "met"  # 200 / 140 = 1.43 >= 1.3
    ours = verdicts["mid, fwd, bf16 (vs our bf16)"]
    assert ours.baseline == "triton" and ours.ratio == pytest.approx(2.0 / 1.3) and ours.verdict() == "met"
    assert verdicts["large, fwd, bf16 (vs our bf16)"].verdict() == "missed by 5%"  # 186 / 140 = 1.33
    assert verdicts["mid, fwd+bwd, bf16"].ratio == pytest.approx(6.3 / 6.0)
    assert report.REPORT.title == title("05_fp8_attn")


def test_ncu_pass_needs_a_gpu_then_profiles_cudnn_our_bf16_and_the_fp8_forward(attention_ncu_calls):
    calls = attention_ncu_calls("05", backward=False)
    assert list(calls) == ["sdpa-cudnn", "triton", "triton-fp8"] and calls["triton"] is attention_forward
    fp8 = calls["triton-fp8"]
    assert fp8.func is fp8_attention_forward and fp8.keywords == {"force_fp8": True}


def test_report_shows_the_ncu_profile_or_says_there_is_none(tmp_path, ncu_profile):
    report = phase_module("05", "report")
    df = gpu_rows({"triton-fp8": 1.3, "triton": 2.0, "sdpa-cudnn": 2.2})
    fig = Figures("05_fp8_attn", tmp_path, "H100")
    ncu_profile.check_report(report, df, fig, "05_fp8_attn", ["triton", "triton-fp8"])
