"""Phase 07's report: gmm_heads against the best of the loop, bmm and compile."""

import pandas as pd
import pytest
import torch

from phases.__main__ import phase_module

bench = phase_module("07", "bench")
report = phase_module("07", "report")


def test_headline_is_gmm_heads_against_the_best_baseline():
    ms = {"loop": 3.0, "bmm": 1.3, "compile": 1.1, "grouped": 1.0, "grouped-save": 0.5}
    df = pd.DataFrame(
        [
            {
                "gpu": "H100",
                "utc": "2026-11-22T01:54:00Z",
                "run_group": "r",
                "variant": v,
                "shape": "small",
                "dtype": "bfloat16",
                "status": "ok",
                "fwd_bwd_ms": t,
            }  # fmt: skip
            for v, t in ms.items()
        ]
    )
    (verdict,) = report.headline(df)
    assert verdict.ours == "grouped" and verdict.baseline == "compile"
    assert verdict.ratio == pytest.approx(1.1) and verdict.verdict() == "missed by 15%"


def test_grouped_nll_cell_checks_against_the_eager_heads_and_loss():
    (cell,) = bench.cells(["tiny"], ["grouped+nll"], torch.float32)
    row = cell.run()
    assert row["err_out"] < 1e-4 and set(row["tiles"].split("; ")[0].split(":")[:1]) == {"heads_fwd"}
