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
