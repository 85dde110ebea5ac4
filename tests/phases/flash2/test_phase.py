"""flash2's command line (parts, their arguments), a tiny run of each part on the CPU, its ncu pass's
command line, and its report's goal line, profile and headline."""

import pandas as pd
import pytest

import common.ncu as ncu
from common import ON_GPU
from common.report import Figures
from phases.__main__ import phase_module, run_phase


def test_no_part_is_a_clear_error_listing_the_parts(capsys):
    with pytest.raises(SystemExit) as exit_:
        run_phase("flash2", [])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "attention-bench, compile-bench, flash-bench" in err


@pytest.mark.parametrize("argv", [["--help"], ["flash-bench", "--help"], ["attention-bench", "--help"]])
def test_help_exits_zero(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_phase("flash2", argv)
    assert exit_.value.code == 0 and "python -m phases flash2" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["flash-bench", "--d", "24"],
        ["attention-bench", "--seq", "0"],
        ["flash-bench", "--tune-shape", "1", "64", "48"],
        ["bench"],
        ["flash-bench", "--dtype", "fp8"],
    ],
)
def test_bad_arguments_are_argparse_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_phase("flash2", argv)
    assert exit_.value.code == 2 and "error:" in capsys.readouterr().err


@pytest.mark.skipif(ON_GPU, reason="CPU smoke run")
def test_each_part_writes_rows(tmp_path):
    def rows_of(argv):
        run_phase("flash2", [*argv, "--out", str(tmp_path), "--no-report"])
        paths = list((tmp_path / "data" / "flash2").glob("*.csv"))
        rows = pd.concat(pd.read_csv(p) for p in paths)
        for p in paths:  # two runs in one second and process would share a file name
            p.unlink()
        assert (rows["status"] == "ok").all(), rows[["variant", "error"]]
        assert rows["ms"].gt(0).all()
        return rows

    naive = rows_of(["attention-bench", "--d", "16", "--seq", "16"])
    assert set(naive["bench"]) == {"attention"} and set(naive["pass"]) == {"fwd", "bwd"}
    flash = rows_of(["flash-bench", "--seq", "16", "--d", "16", "--dtype", "fp32"])
    assert set(flash["variant"]) == {"triton", "naive", "sdpa-math"}
    assert set(flash["pass"]) == {"fwd", "bwd", "fwd+bwd"} and flash["err_dq"].lt(2e-2).all()
    tune = rows_of(["flash-bench", "--tune", "--tune-shape", "1", "32", "16"])
    assert set(tune["pass"]) == {"fwd", "dq", "dkdv"} and tune["in_table"].all()


def goal_rows() -> pd.DataFrame:
    """The goal shape's rows, as flash-bench writes them."""
    base = {"bench": "flash", "shape": "B=16 N=16384 D=64", "dtype": "bf16", "batch": 16, "seq": 16384,
            "head_dim": 64, "causal": "True", "status": "ok", "error": "", "tflops": 300.0, "reps": 10,
            "err_o": 1e-3, "err_dq": 1e-3, "gpu": "H100", "utc": "2026-11-21", "run_group": "g"}  # fmt: skip
    rows = [{**base, "variant": v, "pass": p, "ms": ms}
            for v, ms in {"triton": 5.7, "sdpa-cudnn": 4.5, "sdpa-flash": 6.9}.items()
            for p in ("fwd", "bwd", "fwd+bwd")]  # fmt: skip
    return pd.DataFrame(rows)


def test_report_goal_and_headline(tmp_path):
    report = phase_module("flash2", "report")
    df = goal_rows()
    text = report.REPORT.render(df, Figures("flash2", tmp_path, "H100"))
    assert "<= 4.3 ms: **missed by 1.40 ms" in text and "speedup_vs_sdpa_cudnn" in text
    (verdict,) = report.headline(df)
    assert verdict.baseline == "sdpa-cudnn" and verdict.ratio == pytest.approx(4.5 / 5.7)
    assert verdict.goal == pytest.approx(4.5 / 4.3, abs=1e-3) and verdict.verdict().startswith("missed")


def test_ncu_pass_reads_its_shape_then_needs_a_gpu(monkeypatch, capsys):
    ncu_pass = phase_module("flash2", "ncu_pass")
    monkeypatch.setattr(ncu, "ON_GPU", False)
    with pytest.raises(SystemExit) as exit_:  # parsed before the GPU check: a bad shape is argparse's error
        ncu_pass.main(["--shape", "16", "x", "64"])
    assert exit_.value.code == 2 and "invalid int value" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        ncu_pass.main(["--shape", "1", "128", "64"])
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        ncu_pass.main([])


def test_report_shows_the_ncu_profile_or_says_there_is_none(tmp_path, ncu_profile):
    report = phase_module("flash2", "report")
    df = goal_rows()
    fig = Figures("flash2", tmp_path, "H100")
    none = "_Not profiled yet: `phases/flash2/ncu_pass.py` has the two commands._"
    assert none in report.REPORT.render(df, fig)
    gpu = ncu_profile.write("flash2", "B=16 N=16384 D=64", ["triton"])
    section = report.REPORT.render(df.assign(gpu=gpu), fig).split("## Where the time goes (Nsight Compute)")[
        1
    ]
    assert (
        none not in section
        and "| _our_kernel " in section
        and "One call of each implementation at B=16" in section
    )
    assert ncu_profile.comparison("triton") in section
