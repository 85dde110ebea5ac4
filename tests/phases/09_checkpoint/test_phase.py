"""Phase 09's command line, CPU run, batch search and report: bad values are argparse errors, a tiny
run writes rows for every checkpoint mode, an out-of-memory probe is a row and the search goes on,
and the report opens with a verdict per shape from GPU-like rows."""

import csv

import pandas as pd
import pytest
import torch

from common import ON_GPU, ResultWriter
from common.provenance import REPO_ROOT
from common.report import Figures
from common.step import StepResult
from phases.__main__ import phase_module
from tritonlab.models import CHECKPOINT_MODES, resolve_shape

GPU = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(
    "argv",
    [
        ["--checkpoint", "all"],
        ["--attention", "nope"],
        ["--shape", "huge"],
        ["--dtype", "fp8"],
        ["--batch", "0"],
        ["--steps", "0"],
        ["--warmup", "-1"],
        ["--max-batch", "0"],
        ["--search-steps", "0"],
        ["--search-warmup", "-1"],
    ],
)
def test_cli_rejects_bad_input_before_work(argv, capsys):
    main = phase_module("09", "__main__")
    with pytest.raises(SystemExit) as err:
        main.parse_args(argv)
    assert err.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.skipif(ON_GPU, reason="the CPU's limits")
def test_the_cpu_refuses_big_searches_and_bf16_triton(capsys):
    main = phase_module("09", "__main__")
    for argv in (["--max-batch", "1000"], ["--attention", "triton"], ["--shape", "small"]):
        with pytest.raises(SystemExit) as err:
            main.parse_args(argv)
        assert err.value.code == 2
    assert main.parse_args(["--attention", "triton", "--dtype", "fp32"]).attention == "triton"


def _rows(path) -> list[dict]:
    (csv_path,) = path.glob("*.csv")
    with open(csv_path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.skipif(ON_GPU, reason="what a machine without a GPU runs")
def test_a_tiny_run_writes_rows_for_every_mode(tmp_path):
    main = phase_module("09", "__main__")
    main.main(
        ["--out", str(tmp_path), "--steps", "1", "--warmup", "0", "--search-warmup", "0", "--max-batch", "4"]
    )
    rows = _rows(tmp_path / "data" / "09_checkpoint")
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows]
    shape_rows = [r for r in rows if r["role"] == "shape"]
    assert [r["checkpoint"] for r in shape_rows] == list(CHECKPOINT_MODES)
    assert all(r["batch"] == "2" and r["tokens"] == "96" and float(r["step_ms"]) > 0 for r in shape_rows)
    assert {r["variant"] for r in shape_rows} == {f"ckpt-{m}+sdpa-math" for m in CHECKPOINT_MODES}
    searched = [(r["checkpoint"], r["batch"]) for r in rows if r["role"] == "search"]
    assert searched == [(m, "4") for m in CHECKPOINT_MODES]  # doubling from 2 to the ceiling, 4
    maxima = [r for r in rows if r["role"] == "max"]
    assert [(r["checkpoint"], r["max_batch"], r["stopped"]) for r in maxima] == [
        (m, "4", "cap") for m in CHECKPOINT_MODES
    ]
    assert "CPU smoke runs" in (tmp_path / "09_checkpoint.md").read_text()


def test_find_max_batch_doubles_then_bisects():
    bench = phase_module("09", "bench")
    for limit in (1, 5, 37, 64, 1000):
        tried = []

        def probe(batch, limit=limit, tried=tried):
            tried.append(batch)
            return "ok" if batch <= limit else "oom"

        result = bench.find_max_batch(probe, 2, 4096, known={2: probe(2)})
        assert result.max_batch <= limit < result.oom_batch, (limit, result)
        assert result.oom_batch - result.max_batch <= max(1, result.max_batch * bench.SEARCH_PRECISION)
        assert result.stopped == "bracketed" and result.probes == tried[1:]
        assert len(set(tried)) == len(tried)  # nothing probed twice
    capped = bench.find_max_batch(lambda b: "ok", 3, 20)
    assert (capped.max_batch, capped.oom_batch, capped.stopped, capped.probes) == (
        20,
        None,
        "cap",
        [3, 6, 12, 20],
    )
    broken = bench.find_max_batch(lambda b: "ok" if b < 8 else "RuntimeError: cuDNN", 2, 64)
    assert broken.max_batch == 4 and broken.stopped.startswith("error at batch 8")
    with pytest.raises(ValueError, match="batch search"):
        bench.find_max_batch(lambda b: "ok", 0, 8)


def _fake_step(limits: dict, errors: dict | None = None):
    """measure_training_step as if each mode fitted batches up to its limit, ``torch.OutOfMemoryError``
    above it, and raised another error at the batches ``errors`` names."""

    def fake(cfg, components, shape, dtype_name, *, checkpoint="none", **kw):
        if shape.batch in (errors or {}).get(checkpoint, ()):
            raise RuntimeError("cuDNN Frontend error: no valid execution plan")
        if shape.batch > limits[checkpoint] and checkpoint == "mlp":  # as cuDNN reports it
            raise RuntimeError("cuDNN Frontend error: [cudnn_frontend] CUDNN_STATUS_ALLOC_FAILED")
        if shape.batch > limits[checkpoint]:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {shape.batch} GiB")
        step_ms = shape.batch * (1.3 if checkpoint != "none" else 1.0)
        return StepResult(step_ms, step_ms, step_ms, step_ms / 3, step_ms / 2, 0.1,
                          shape.tokens / step_ms * 1e3, shape.batch / 10, 1, 1.0)  # fmt: skip

    return fake


def test_the_search_records_each_oom_as_a_row_and_goes_on(monkeypatch):
    bench = phase_module("09", "bench")
    monkeypatch.setattr(
        bench, "measure_training_step", _fake_step({"none": 5, "block": 40, "mlp": 1}, {"block": {32}})
    )
    setup = bench.Setup(
        bench.CPU_CONFIG, "sdpa-math", "fp32", steps=1, warmup=0, search_steps=1, search_warmup=0
    )
    writer = ResultWriter("09_checkpoint")
    rows = bench.run_phase(writer, setup, [resolve_shape("tiny")], ["none", "mlp", "block"], max_batch=64)

    def probes(mode):
        return [
            (int(r["batch"]), r["status"]) for r in rows if r["checkpoint"] == mode and r["role"] != "max"
        ]

    assert probes("none") == [(2, "ok"), (4, "ok"), (8, "oom"), (6, "oom"), (5, "ok")]
    assert probes("mlp") == [(2, "oom"), (1, "ok")]  # the shape's own batch ran out: searched below it
    assert probes("block") == [(2, "ok"), (4, "ok"), (8, "ok"), (16, "ok"), (32, "error")]
    oom = next(r for r in rows if r["status"] == "oom" and r["role"] == "search")
    assert "out of memory" in oom["error"] and (oom["variant"], oom["batch"]) == ("ckpt-none+sdpa-math", 8)
    maxima = {r["checkpoint"]: r for r in rows if r["role"] == "max"}
    assert (maxima["none"]["max_batch"], maxima["none"]["oom_batch"], maxima["none"]["stopped"]) == (
        5,
        6,
        "bracketed",
    )
    assert (maxima["mlp"]["max_batch"], maxima["mlp"]["oom_batch"]) == (1, 2)
    mlp_oom = next(r for r in rows if r["checkpoint"] == "mlp" and r["status"] == "oom")
    assert "CUDNN_STATUS_ALLOC_FAILED" in mlp_oom["error"]
    assert maxima["block"]["max_batch"] == 16 and maxima["block"]["stopped"].startswith("error at batch 32")
    assert len(writer.rows) == len(rows)  # every probe and summary is a row on disk


def _gpu_rows() -> pd.DataFrame:
    """Synthetic H100 rows: at small, none fits up to 256 and block to 1024 but never catches up;
    at mid, none runs out of memory at its own batch and only block runs."""
    rows = []

    def add(shape, mode, batch, role, tokens_per_s=None, status="ok", **extra):
        tokens = batch * {"small": 564, "mid": 11_000}[shape]
        row = {"gpu": GPU, "variant": f"ckpt-{mode}+sdpa-cudnn", "shape": shape, "dtype": "bf16", "status": status,
               "error": "" if status == "ok" else "OutOfMemory: CUDA out of memory", "checkpoint": mode,
               "attention": "sdpa-cudnn", "compile": False, "role": role, "batch": batch, "tokens": tokens,
               "utc": "2026-11-26T10:00:00Z", "run_group": "g1"}  # fmt: skip
        if status == "ok" and tokens_per_s is not None:
            step_ms = tokens / tokens_per_s * 1e3
            row.update(step_ms=step_ms, tokens_per_s=tokens_per_s, forward_ms=step_ms / 3, backward_ms=step_ms / 2,
                       peak_mem_gb=batch / 16)  # fmt: skip
        rows.append({**row, **extra})

    for batch, tps in ((64, 400e3), (128, 420e3), (256, 425e3)):
        add("small", "none", batch, "shape" if batch == 64 else "search", tps)
    add("small", "none", 512, "search", status="oom")
    add("small", "none", 384, "search", status="oom")
    add(
        "small",
        "none",
        256,
        "max",
        max_batch=256,
        oom_batch=384,
        stopped="bracketed",
        probes="128 256 512 384",
    )
    for batch, tps in ((64, 300e3), (128, 320e3), (256, 330e3), (512, 335e3), (1024, 340e3)):
        add("small", "block", batch, "shape" if batch == 64 else "search", tps)
    add("small", "block", 1024, "max", max_batch=1024, oom_batch="", stopped="cap", probes="128 256 512 1024")
    add("mid", "none", 4, "shape", status="oom")
    add("mid", "block", 4, "shape", 250e3)
    return pd.DataFrame(rows)


def test_the_report_opens_with_a_verdict_per_shape(tmp_path):
    report = phase_module("09", "report")
    small, mid = report.headline(_gpu_rows())
    assert small.ours == "block at B=1024" and small.baseline == "none at B=256"
    assert abs(small.ratio - 340 / 425) < 1e-9 and small.verdict().startswith("missed")
    assert mid.ratio == float("inf") and mid.verdict() == "met" and mid.baseline == "none ran out of memory"
    text = report.render(_gpu_rows(), Figures("09_checkpoint", tmp_path, GPU))
    first = text.split("\n## At the shape's batch")[0]
    assert "**small** (sdpa-cudnn, bf16): **checkpointing does not pay**" in first and "0.80×" in first
    assert "**mid** (sdpa-cudnn, bf16): **checkpointing is the only way this shape runs**" in first
    assert "block: the search's ceiling, not memory, stopped it" in first
    assert "step_vs_none" in text and "1.333" in text  # block's step at B=64: 400k / 300k tokens/s
    assert "The largest batch that fits" in text and "oom" in text
    assert (tmp_path / "figures" / "09_checkpoint_tokens_per_s_small_bf16_sdpa-cudnn.png").exists()
    assert (
        report.REPORT.title
        == (REPO_ROOT / "phases" / "09_checkpoint" / "README.md").read_text().splitlines()[0][2:]
    )


def test_a_report_of_cpu_like_rows_without_a_search_still_renders(tmp_path):
    report = phase_module("09", "report")
    rows = _gpu_rows()
    rows = rows.loc[rows["role"] == "shape"]
    text = report.render(rows, Figures("09_checkpoint", tmp_path, GPU))
    assert "no batch search" in text and "_no batch search in these rows_" in text
