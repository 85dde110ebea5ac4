"""Phase sparse_ffn: its command line, a tiny CPU run of each part, and its report's headline."""

from pathlib import Path

import pandas as pd
import pytest
import torch

from phases.__main__ import phase_module

pytest.importorskip("transformers")
main = phase_module("sparse_ffn", "__main__")
bench = phase_module("sparse_ffn", "bench")
report = phase_module("sparse_ffn", "report")


def test_the_first_output_line_says_the_backward_is_wrong_for_training(capsys, tmp_path):
    main.main(["--out", str(tmp_path), "--fractions", "0", "1", "--no-report"])
    first = capsys.readouterr().out.splitlines()[0]
    assert "numerically WRONG for training" in first
    assert report.REPORT.title.count("numerically WRONG for training") == 1
    readme = Path(main.__file__).with_name("README.md").read_text().splitlines()[0]
    assert "numerically WRONG for training" in readme


@pytest.mark.parametrize("argv", [["--fractions", "1.5"], ["--dtype", "bf16"], ["--shape", "32x512"]])
def test_bad_arguments_exit_2(argv):
    with pytest.raises(SystemExit) as exit_:
        main.parse_args(argv)
    assert exit_.value.code == 2


def test_kernel_cells_check_and_zero_rows():
    cells = list(bench.kernel_cells(["tiny"], [0.5], torch.float32))
    assert [c.variant for c in cells] == ["ours", "cublas-slice", "cublas-full"] * 2
    row = cells[0].run()
    assert row["ms"] > 0 and "BLOCK_M" in row["tiles"]


def test_model_cells_replace_only_the_chosen_layers():
    cells = list(bench.model_cells("roberta", ["tiny"], [0.25], torch.float32, [1], None))
    assert [c.variant for c in cells] == ["original", "sliced"]
    assert cells[1].columns["n_rows"] == 4 and cells[1].columns["n_layers"] == 1
    row = cells[1].run()
    assert row["bwd_ms"] == pytest.approx(row["fwd_bwd_ms"] - row["fwd_ms"])


def test_headline_is_ours_against_cublas_on_the_slice_and_render_has_the_ideal():
    base = {"gpu": "H100", "utc": "2026-11-25T00:00:00Z", "run_group": "r", "dtype": "bf16", "status": "ok"}
    rows = [
        {**base, "part": "kernel", "variant": v, "shape": "32x512", "layer": "output", "fraction": 1.0,
         "n_rows": 16384, "ms": ms}
        for v, ms in {"ours": 1.0, "cublas-slice": 0.9, "cublas-full": 0.9}.items()
    ] + [
        {**base, "part": "kernel", "variant": "cublas-full", "shape": "32x512", "layer": "intermediate",
         "fraction": 1.0, "n_rows": 16384, "ms": 0.9},
        {**base, "part": "model", "variant": "original", "shape": "32x512", "model": "bert", "fraction": 1.0,
         "n_rows": 16384, "n_layers": 12, "layers": "all", "fwd_ms": 10.0, "bwd_ms": 40.0, "fwd_bwd_ms": 50.0},
        {**base, "part": "model", "variant": "sliced", "shape": "32x512", "model": "bert", "fraction": 0.0,
         "n_rows": 0, "n_layers": 12, "layers": "all", "fwd_ms": 10.0, "bwd_ms": 30.0, "fwd_bwd_ms": 40.0},
    ]  # fmt: skip
    df = pd.DataFrame(rows)
    (verdict,) = report.headline(df)
    assert (
        verdict.ours == "ours" and verdict.ratio == pytest.approx(0.9) and verdict.verdict() == "missed by 5%"
    )
    text = report.render(df, None)
    assert "numerically WRONG for training" in text and "ideal_bwd_speedup" in text
    # 12 layers x 1.8 ms of FFN dX saved at N = 0: 40 / (40 - 21.6)
    assert f"{40 / (40 - 21.6):.4g}" in text
