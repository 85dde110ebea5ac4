"""common.runner: every cell is a row -- measurements, a failed check, an OOM -- and rows go out as they finish."""

import csv

import pytest
import torch

from common import Cell, ResultWriter, check_close, run_cells, timed


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_cells_become_rows_and_failures_do_not_stop_the_sweep():
    def wrong():
        check_close("o", 0.5, 1e-2)

    def oom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80 GiB")

    cells = [
        Cell("good", "tiny", "fp32", lambda: {"ms": 1.0}, {"tokens": 7}),
        Cell("wrong", "tiny", "fp32", wrong),
        Cell("big", "tiny", "fp32", oom),
        Cell("after", "tiny", "fp32", lambda: {"ms": 2.0}),
    ]
    writer = ResultWriter("unit")
    rows = run_cells(writer, cells)
    on_disk = read_rows(writer.path)
    assert [r["variant"] for r in on_disk] == ["good", "wrong", "big", "after"]
    assert [r["status"] for r in rows] == ["ok", "error", "oom", "ok"]
    assert "exceeds" in on_disk[1]["error"] and on_disk[0]["tokens"] == "7"


def test_a_finished_row_is_on_disk_before_the_next_cell_runs():
    writer = ResultWriter("unit")
    seen = []

    def second():
        seen.append([r["variant"] for r in read_rows(writer.path)])
        return {"ms": 1.0}

    run_cells(
        writer,
        (c for c in [Cell("a", "s", "fp32", lambda: {"ms": 1.0}), Cell("b", "s", "fp32", second)]),
        total=2,
    )
    assert seen == [["a"]]


def test_nan_fails_a_check():
    with pytest.raises(AssertionError):
        check_close("dq", float("nan"), 1.0)
    check_close("dq", 0.5, 1.0)


def test_timed_counts_work_not_implementation():
    row = timed(lambda: None, flops=2e12, nbytes=1e9, warmup_ms=0.1, rep_ms=0.1, min_reps=3)
    assert row["reps"] >= 3 and row["tflops"] > 0 and row["gbps"] > 0
    assert row["p20_ms"] <= row["ms"] <= row["p80_ms"]


def test_progress_lines_in_a_log(capsys):
    run_cells(ResultWriter("unit"), [Cell("a", "tiny", "fp32", lambda: {"ms": 1.5})])
    assert "a" in capsys.readouterr().out
