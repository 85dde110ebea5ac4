"""Phase sparse_ffn: its command line, a tiny CPU run of each part and of the profile, and its report."""

from pathlib import Path

import pandas as pd
import pytest
import torch

from phases.__main__ import phase_module

pytest.importorskip("transformers")
main = phase_module("sparse_ffn", "__main__")
bench = phase_module("sparse_ffn", "bench")
data = phase_module("sparse_ffn", "data")
report = phase_module("sparse_ffn", "report")

WRONG = "numerically WRONG for training"


def test_a_cpu_run_says_first_that_the_backward_is_wrong_and_which_data_fed_it(capsys, tmp_path):
    main.main(["--out", str(tmp_path), "--fractions", "0", "1", "--generated", "--profile"])
    assert WRONG in capsys.readouterr().out.splitlines()[0]
    assert (tmp_path / "sparse_ffn.md").read_text().splitlines()[0].count(WRONG) == 1
    assert WRONG in Path(main.__file__).with_name("README.md").read_text().splitlines()[0]
    (csv,) = (tmp_path / "data" / "sparse_ffn").glob("*.csv")
    rows = pd.read_csv(csv)
    assert (rows["status"] == "ok").all(), rows["error"].dropna().tolist()
    model = rows.loc[rows["part"] == "model"]
    assert len(model) == 3 and set(model["data"]) == {"generated sst2-like sample"}
    assert model["tokenizer"].str.startswith("WordPiece trained here").all()
    profile = rows.loc[rows["part"] == "profile"]
    assert list(profile["rank"]) == list(range(1, bench.PROFILE_TOP + 1)) and set(profile["clock"]) == {"cpu"}
    assert len(rows.loc[rows["part"] == "kernel"]) == 2 * 2 * 5  # two layers, two slices, five variants


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--fractions", "1.5"], "--fractions"),
        (["--dtype", "bf16"], "--dtype"),
        (["--shape", "32x512"], "--shape"),
        (["--task", "mnli"], "--task"),
        (["--batch", "0"], "--batch"),
        (["--seq-len", "3"], "--seq-len"),
        (["--batch", "32"], "--batch/--seq-len"),  # 32 x 8 rows: too many for the interpreter
        (["--generated", "--tokenizer", "x"], "--tokenizer"),
        (["--generated", "--data-dir", "x"], "--data-dir"),
        (["--parts", "attention"], "--parts"),
        (["--n-rows", "17"], "--n-rows"),  # tiny has 2 x 8 rows
        (["--n-rows", "-1"], "--n-rows"),
        (["--n-rows", "1", "--fractions", "0"], "--fractions"),
    ],
)
def test_bad_arguments_exit_2_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        main.parse_args(argv)
    assert exit_.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--layers", "0", "2"], "--layers: index 2 is out of range for a model of 2 layers"),
        (["--model", "no-such-model"], "--model: 'no-such-model' is neither a local model"),
        (["--data-dir", "{tmp}"], "--data-dir: no sst2/validation-*.parquet"),
        (["--tokenizer", "{tmp}/none"], "--tokenizer: no tokenizer found locally"),
    ],
)
def test_inputs_that_cannot_be_had_exit_2_naming_the_flag(argv, message, capsys, tmp_path):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    with pytest.raises(SystemExit) as exit_:
        main.main(["--parts", "model", "--no-report", *argv])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_sequence_longer_than_the_models_positions_is_refused():
    args = main.parse_args(["--parts", "kernel"])
    args.shapes = [("1x600", 1, 600)]  # the CPU refuses this before; a GPU run meets this check
    with pytest.raises(
        ValueError,
        match="^--shape/--seq-len: a sequence of 600 is longer than bert-base-uncased's 130 positions",
    ):
        main.prepare(args)


def test_batch_and_seq_len_override_the_shape_and_n_rows_the_fractions():
    args = main.parse_args(["--batch", "4", "--seq-len", "16", "--n-rows", "0", "64"])
    assert args.shapes == [("4x16", 4, 16)] and args.n_rows == [0, 64]
    assert bench.slices(64, args.fractions, args.n_rows) == [(0.0, 0), (1.0, 64)]
    assert main.parse_args([]).shapes == [("tiny", 2, 8)]
    assert bench.slices(16, [0, 0.125, 1]) == [(0, 0), (0.125, 2), (1, 16)]


def test_kernel_cells_check_and_zero_rows():
    cells = list(bench.kernel_cells([("tiny", 2, 8)], [0.5], torch.float32, hidden=32, intermediate=48))
    assert [c.variant for c in cells] == [
        "ours",
        "ours-pointer",
        "cublas-slice",
        "cublas-slice-zeros",
        "cublas-full",
    ] * 2
    assert (cells[0].columns["k"], cells[0].columns["d"]) == (48, 32)
    by_count = bench.kernel_cells([("tiny", 2, 8)], None, torch.float32, 32, 48, n_rows=[3])
    assert {(c.columns["n_rows"], c.columns["fraction"]) for c in by_count} == {(3, 3 / 16)}
    row = cells[0].run()
    assert row["ms"] > 0 and "BLOCK_M" in row["tiles"]


def tiny(kind: str, task: str = "mrpc"):
    sample = data.generated_sample(task, 2)
    spec = bench.resolve_model(kind)
    tokenizer = data.train_tokenizer(spec.family, sample.texts())
    model, weights = bench.build_model(spec, tokenizer, torch.float32)
    return sample, tokenizer, model, weights


def test_model_cells_replace_only_the_chosen_layers_and_name_their_inputs():
    sample, tokenizer, model, weights = tiny("roberta-base")
    about = {"model": "roberta-base", "weights": weights}
    cells = list(
        bench.model_cells(model, about, tokenizer, [sample], [("tiny", 2, 8)], [0.25], torch.float32, [1])
    )
    assert [c.variant for c in cells] == ["original", "sliced"]
    cols = cells[1].columns
    assert cols["n_rows"] == 4 and cols["n_layers"] == 1 and cols["task"] == "mrpc"
    assert cols["data"] == "generated mrpc-like sample" and cols["weights"] == "random (tiny roberta config)"
    row = cells[1].run()
    assert row["bwd_ms"] == pytest.approx(row["fwd_bwd_ms"] - row["fwd_ms"])


def test_profile_rows_rank_the_backwards_cpu_operators_and_the_report_says_cpu_time():
    sample, tokenizer, model, _ = tiny("bert-base-uncased", "sst2")
    rows = bench.profile_rows(model, data.encode(tokenizer, sample, 2, 8, "cpu"), top=5)
    assert [r["rank"] for r in rows] == [1, 2, 3, 4, 5] and {r["clock"] for r in rows} == {"cpu"}
    shares = [r["share"] for r in rows]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1
    assert all(p.grad is None for p in model.parameters())  # it leaves no gradients behind
    base = {"gpu": "cpu", "utc": "2026-11-25T00:00:00Z", "run_group": "r", "status": "ok", "variant": "original",
            "shape": "tiny", "dtype": "fp32", "model": "bert-base-uncased", "task": "sst2"}  # fmt: skip
    text = report.render(pd.DataFrame([{**base, **r} for r in rows]), None)
    assert "Where the original model's backward spends its time" in text and "**CPU time**" in text
    assert rows[0]["name"] in text


def test_headline_is_ours_against_cublas_on_the_slice_and_render_has_the_ideal():
    base = {"gpu": "H100", "utc": "2026-11-25T00:00:00Z", "run_group": "r", "dtype": "bf16", "status": "ok"}
    kernel = {**base, "part": "kernel", "shape": "32x512", "fraction": 1.0, "n_rows": 16384}
    model = {**base, "part": "model", "shape": "32x512", "model": "bert-base-uncased", "task": "sst2",
             "data": "glue/sst2 (local)", "n_layers": 12, "layers": "all"}  # fmt: skip
    rows = [
        {**kernel, "variant": v, "layer": "output", "k": 768, "d": 3072, "ms": ms}
        for v, ms in {"ours": 1.0, "cublas-slice": 0.9, "cublas-full": 0.9}.items()
    ] + [
        {**kernel, "variant": "cublas-full", "layer": "intermediate", "k": 3072, "d": 768, "ms": 0.9},
        {**model, "variant": "original", "fraction": 1.0, "n_rows": 16384, "fwd_ms": 10.0, "bwd_ms": 40.0,
         "fwd_bwd_ms": 50.0},
        {**model, "variant": "sliced", "fraction": 0.0, "n_rows": 0, "fwd_ms": 10.0, "bwd_ms": 30.0,
         "fwd_bwd_ms": 40.0},
    ]  # fmt: skip
    df = pd.DataFrame(rows)
    (verdict,) = report.headline(df)
    assert (
        verdict.ours == "ours" and verdict.ratio == pytest.approx(0.9) and verdict.verdict() == "missed by 5%"
    )
    assert report.headline(df.assign(k=df["k"] * 2)) == []  # another model's FFN is not the headline
    text = report.render(df, None)
    assert WRONG in text and "ideal_bwd_speedup" in text and "glue/sst2 (local)" in text
    # 12 layers x 1.8 ms of FFN dX saved at N = 0: 40 / (40 - 21.6)
    assert f"{40 / (40 - 21.6):.4g}" in text


@pytest.mark.gpu
def test_gpu_profile_rows_are_cuda_kernels_by_cuda_time():
    sample, tokenizer, model, _ = tiny("bert-base-uncased", "sst2")  # bert-base sized on a GPU
    rows = bench.profile_rows(model, data.encode(tokenizer, sample, 2, 128, "cuda"))
    assert len(rows) == bench.PROFILE_TOP and {r["clock"] for r in rows} == {"cuda"}
    assert not any(r["name"].startswith("aten::") for r in rows)  # kernels, not operators
    assert all(r["self_ms"] > 0 for r in rows) and sum(r["share"] for r in rows) <= 1 + 1e-9
