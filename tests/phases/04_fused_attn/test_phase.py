"""Phase 04's command line, a tiny run on the CPU, its ncu pass, and its report's profile and headline
from GPU-like rows."""

import pandas as pd
import pytest

from common import ON_GPU
from common.report import Figures
from phases.__main__ import phase_module, run_phase
from tritonlab.attention import attention, fused_attention


@pytest.mark.parametrize(
    ("argv", "code"), [(["--help"], 0), (["--two-pass-on", "huge"], 2), (["--graphed-on", "nope"], 2)]
)
def test_help_and_bad_values(argv, code):
    with pytest.raises(SystemExit) as exit_:
        run_phase("04", argv)
    assert exit_.value.code == code


@pytest.mark.skipif(ON_GPU, reason="CPU smoke run")
def test_tiny_run_side_by_side_with_the_two_pass_backward(tmp_path, capsys):
    with pytest.raises(SystemExit):  # no CUDA graphs on the CPU
        run_phase("04", ["--graphed-on", "tiny"])
    assert "CUDA graphs need a CUDA GPU" in capsys.readouterr().err
    run_phase("04", ["--out", str(tmp_path), "--no-report", "--sweep-lk", "20"])
    rows = pd.concat(pd.read_csv(p) for p in (tmp_path / "data" / "04_fused_attn").glob("*.csv"))
    assert (rows["status"] == "ok").all(), rows[["variant", "error"]]
    by_shape = rows.groupby("shape")["variant"].apply(set).to_dict()
    assert by_shape == {
        "tiny": {"triton-fused", "triton-fused-det", "triton-2pass"},
        "sweep-Lk20": {"triton-fused"},
    }
    assert rows.loc[rows["variant"] == "triton-fused", "fused_config"].str.startswith("interpreter:").all()


def test_the_shape_choices_hold_at_another_head_dim():
    # --two-pass-on and --graphed-on name TNP shapes; a case at D = 128 is still that shape.
    main, bench = phase_module("04", "__main__"), phase_module("04", "bench")
    args = main.parse_args(["--head-dim", "128", "--two-pass-on", "tiny", "--sweep-lk", "20"])
    assert [c.label for c in args.cases] == ["tiny-d128", "sweep-Lk20-d128"]
    _, total = bench.cells(args.cases, args.dtype, args.two_pass_on, [])
    _, fused_only = bench.cells(args.cases, args.dtype, [], [])
    assert total == fused_only + 2  # the two-pass and the deterministic fused variants at tiny-d128


def test_headline_has_the_graphed_small_cell(attention_rows):
    report = phase_module("04", "report")
    rows = pd.concat(
        attention_rows(
            {"triton-fused": ours, "triton-2pass": 0.5, "sdpa-cudnn": 0.26, "sdpa-flash": 0.4}, "small", mode
        )
        for mode, ours in (("fwd+bwd", 0.36), ("fwd+bwd graphed", 0.13))
    )
    verdicts = {v.cell: v for v in report.headline(rows)}
    assert verdicts["small, fwd+bwd graphed, bf16"].ratio == pytest.approx(2.0)
    assert verdicts["small, fwd+bwd graphed, bf16"].verdict() == "met"
    assert verdicts["small, fwd+bwd, bf16"].verdict().startswith("missed")
    # ... and against the two-pass backward of the same run (0.5 ms in both modes)
    assert verdicts["small, fwd+bwd graphed, bf16 (vs the two-pass backward)"].ratio == pytest.approx(
        0.5 / 0.13
    )
    assert verdicts["small, fwd+bwd, bf16 (vs the two-pass backward)"].verdict() == "met"


def test_ncu_pass_needs_a_gpu_then_profiles_cudnn_and_both_backwards(attention_ncu_calls):
    calls = attention_ncu_calls("04", backward=True)
    assert list(calls) == ["sdpa-cudnn", "triton-2pass", "triton-fused"]
    assert calls["triton-2pass"] is attention and calls["triton-fused"] is fused_attention


def test_report_shows_the_ncu_profile_or_says_there_is_none(tmp_path, ncu_profile, attention_rows):
    report = phase_module("04", "report")
    df = attention_rows({"triton-fused": 7.0, "triton-2pass": 9.0, "sdpa-cudnn": 8.0})
    fig = Figures("04_fused_attn", tmp_path, "H100")
    ncu_profile.check_report(report, df, fig, "04_fused_attn", ["triton-2pass", "triton-fused"])
