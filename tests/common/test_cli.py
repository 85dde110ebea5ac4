"""The shared phase command line: choices listed on a bad value, --help exits 0, big shapes refused on the CPU."""

import pytest

from common import ON_GPU
from common.cli import parse_phase_args, phase_parser


def demo_parser():
    return phase_parser(
        "demo", "a demo phase", shapes=["tiny", "small", "mid"], gpu_shapes=["small"], dtypes=["bf16", "fp32"]
    )


def test_bad_shape_lists_the_choices(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_phase_args(demo_parser(), ["--shape", "huge"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "huge" in err and "tiny" in err and "mid" in err


def test_bad_dtype_lists_the_choices(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_phase_args(demo_parser(), ["--dtype", "fp8"])
    assert exit_.value.code == 2 and "bf16" in capsys.readouterr().err


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_phase_args(demo_parser(), ["--help"])
    assert exit_.value.code == 0 and "--out" in capsys.readouterr().out


@pytest.mark.skipif(ON_GPU, reason="the refusal is for machines without a GPU")
def test_a_gpu_shape_is_refused_at_once_on_the_cpu(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_phase_args(demo_parser(), ["--shape", "mid"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "interpreter" in err and "--shape tiny" in err


def test_out_redirects_rows(tmp_path, monkeypatch):
    from common.results import data_dir

    args = parse_phase_args(demo_parser(), ["--out", str(tmp_path / "o")])
    assert data_dir() == (tmp_path / "o" / "data").resolve()
    assert args.shape == (["small"] if ON_GPU else ["tiny"])


def test_choices_argument_defaults_to_all_and_lists_the_choices(capsys):
    from common.cli import choices_argument

    parser = demo_parser()
    choices_argument(parser, "--variants", ("a", "b"), "VARIANT")
    choices_argument(
        parser, "--passes", ("fwd", "bwd"), "PASS", all_by_default=False, default_help="fwd only"
    )
    args = parse_phase_args(parser, [])
    assert args.variants == ["a", "b"] and args.passes is None
    assert parse_phase_args(parser, ["--variants", "b"]).variants == ["b"]
    help_text = parser.format_help()
    assert "any of a, b (default: all)" in help_text and "any of fwd, bwd (default: fwd only)" in help_text
    with pytest.raises(SystemExit) as exit_:
        parse_phase_args(parser, ["--variants", "c"])
    assert exit_.value.code == 2 and "'a', 'b'" in capsys.readouterr().err


@pytest.mark.skipif(ON_GPU, reason="the refusal is for machines without a GPU")
def test_bf16_is_refused_on_the_cpu(capsys):
    from common.cli import refuse_bf16_on_cpu

    parser = demo_parser()
    refuse_bf16_on_cpu(parser, "fp32", "fp16")  # nothing to refuse
    with pytest.raises(SystemExit) as exit_:
        refuse_bf16_on_cpu(parser, "fp32", "bf16")
    assert exit_.value.code == 2 and "bf16 dots are wrong" in capsys.readouterr().err


def test_phase_run_prints_the_banner_rows_and_report(tmp_path, monkeypatch, capsys):
    from common.cli import phase_run
    from common.device import interpreter_banner
    from common.report import PhaseReport

    monkeypatch.setenv("TRITONLAB_DATA_DIR", str(tmp_path / "data"))
    report = PhaseReport("demo", "demo — a phase")
    with phase_run("demo", report) as writer:
        writer.write({"variant": "v", "shape": "tiny", "dtype": "fp32", "ms": 1.0})
    out = capsys.readouterr().out
    assert out.splitlines()[0] == interpreter_banner()
    assert f"rows: {writer.path}" in out and writer.path.parent == tmp_path / "data" / "demo"
    assert f"report: {tmp_path / 'demo.md'}" in out and (tmp_path / "demo.md").exists()

    with phase_run("demo", report, no_report=True, subdir="tune") as writer:
        pass
    out = capsys.readouterr().out
    assert writer.path.parent == tmp_path / "data" / "demo" / "tune" and "report:" not in out


def test_phase_run_renders_nothing_when_its_block_raises(tmp_path, monkeypatch, capsys):
    from common.cli import phase_run
    from common.report import PhaseReport

    monkeypatch.setenv("TRITONLAB_DATA_DIR", str(tmp_path / "data"))
    with pytest.raises(RuntimeError), phase_run("demo", PhaseReport("demo", "demo")):
        raise RuntimeError("a cell's setup failed")
    out = capsys.readouterr().out
    assert "rows:" not in out and "report:" not in out


def test_fwd_bwd_parser_has_the_tnp_shapes_and_variants():
    from common.fwd_bwd import fwd_bwd_parser

    parser = fwd_bwd_parser("demo", "a demo phase", ("x", "y"), dtypes=("bf16", "fp32"), epilog="e")
    args = parse_phase_args(parser, [])
    assert args.shape == (["small", "mid", "large"] if ON_GPU else ["tiny"])
    assert args.dtype == ("bf16" if ON_GPU else "fp32") and args.variants == ["x", "y"]
    assert "one or more of: tiny, small, mid, large" in parser.format_help()
