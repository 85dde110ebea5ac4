"""Phase 03's command line, a tiny run on the CPU, its ncu pass, and its report's profile and headline
from GPU-like rows."""

import pandas as pd
import pytest

from common import ON_GPU
from common.report import Figures
from phases.__main__ import phase_module, run_phase
from tritonlab.attention import attention


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as exit_:
        run_phase("03", ["--help"])
    assert exit_.value.code == 0 and "--sweep" in capsys.readouterr().out


@pytest.mark.skipif(ON_GPU, reason="CPU smoke run")
def test_tiny_run_writes_rows_with_both_backward_configs(tmp_path):
    run_phase("03", ["--out", str(tmp_path), "--no-report", "--dtype", "fp32"])
    rows = pd.concat(pd.read_csv(p) for p in (tmp_path / "data" / "03_attn_bwd").glob("*.csv"))
    assert (rows["status"] == "ok").all(), rows[["variant", "error"]]
    assert list(rows["variant"]) == ["triton-2pass"] and list(rows["mode"]) == ["fwd+bwd"]
    for column in ("config", "dkdv_config", "dq_config", "err_dq", "relerr_dv"):
        assert column in rows


def test_headline_against_the_best_sdpa_backend(attention_rows):
    report = phase_module("03", "report")
    df = attention_rows({"triton-2pass": 9.0, "sdpa-cudnn": 8.0, "sdpa-flash": 11.0})
    (verdict,) = report.headline(df)
    assert verdict.baseline == "sdpa-cudnn" and verdict.ratio == pytest.approx(8 / 9)
    assert verdict.verdict() == "missed by 11%"


def test_ncu_pass_needs_a_gpu_then_profiles_cudnn_and_the_two_pass_backward(attention_ncu_calls):
    calls = attention_ncu_calls("03", backward=True)
    assert list(calls) == ["sdpa-cudnn", "triton-2pass"] and calls["triton-2pass"] is attention


def test_report_shows_the_ncu_profile_or_says_there_is_none(tmp_path, ncu_profile, attention_rows):
    report = phase_module("03", "report")
    df = attention_rows({"triton-2pass": 9.0, "sdpa-cudnn": 8.0})
    fig = Figures("03_attn_bwd", tmp_path, "H100")
    ncu_profile.check_report(report, df, fig, "03_attn_bwd", ["triton-2pass"])
