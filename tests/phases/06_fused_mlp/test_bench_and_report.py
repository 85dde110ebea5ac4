"""Phase 06's cells and report: a Triton cell's row names its tiles, the report lists them, the headline
is fused_mlp against the best of eager and compile."""

import pandas as pd
import torch

from common.fwd_bwd import tiles_table
from phases.__main__ import phase_module

bench = phase_module("06", "bench")
report = phase_module("06", "report")


def test_a_triton_cell_checks_times_and_names_its_tiles():
    cells = {c.variant: c for c in bench.cells(["tiny"], ["eager", "fused-recompute"], torch.float32)}
    row = cells["fused-recompute"].run()
    assert row["err_out"] < 1e-4 and row["fwd_bwd_ms"] > 0 and row["fwd_bwd_tflops"] > 0
    assert row["tiles"].startswith("staged: ") and "warps=" in row["tiles"]
    assert "tiles" not in cells["eager"].run()


def test_report_lists_tiles_only_where_rows_have_them():
    rows = pd.DataFrame(
        {
            "shape": ["mid", "mid"],
            "variant": ["eager", "fused"],
            "tiles": [None, "staged: BLOCK_F=256,warps=8,stages=3"],
        }
    )
    table = tiles_table(rows)
    assert "fused" in table and "BLOCK_F=256" in table and "eager" not in table
    assert tiles_table(rows.drop(columns="tiles")) == ""
    assert tiles_table(rows.iloc[:1]) == ""


def test_headline_is_fused_mlp_against_the_best_of_eager_and_compile():
    ms = {"eager": 3.4, "compile": 1.25, "fused-recompute": 1.0, "padded-cublas": 0.8}
    df = pd.DataFrame(
        [
            {
                "gpu": "H100",
                "utc": "2026-11-22T01:54:00Z",
                "run_group": "r",
                "variant": v,
                "shape": shape,
                "dtype": "bfloat16",
                "status": "ok",
                "fwd_bwd_ms": t,
            }  # fmt: skip
            for shape in ("mid", "large")
            for v, t in ms.items()
        ]
    )
    verdicts = report.headline(df)
    assert [v.cell for v in verdicts] == ["mid, bf16, fwd+bwd", "large, bf16, fwd+bwd"]
    assert all(v.ours == "fused-recompute" and v.baseline == "compile" for v in verdicts)
    assert verdicts[0].ratio == 1.25 and verdicts[0].verdict() == "met"
