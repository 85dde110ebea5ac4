"""The tiles column of phases 06 and 07: what the autotuner chose, named per kernel and pass."""

import importlib
from types import SimpleNamespace

import pandas as pd
import triton

bench = importlib.import_module("phases.06_fused_mlp.bench")
report = importlib.import_module("phases.06_fused_mlp.report")


def _tuner(keys, cache):
    return SimpleNamespace(keys=keys, cache=cache)


def test_tiles_chosen_names_each_pass_at_these_tokens():
    hidden_keys = ["T", "D_FF", "N_OUT", "D_IN", "RECOMPUTE_A", "HAS_DY"]
    forward_pass = triton.Config({"BLOCK_M": 128, "BLOCK_F": 128}, num_warps=8, num_stages=3)
    backward_pass = triton.Config({"BLOCK_M": 64, "BLOCK_F": 256}, num_warps=8, num_stages=4)
    elsewhere = triton.Config({"BLOCK_M": 32, "BLOCK_F": 64}, num_warps=4, num_stages=2)
    hidden = _tuner(
        hidden_keys,
        {
            (44_000, 1376, 512, 512, True, False, "torch.bfloat16"): forward_pass,
            (44_000, 1376, 512, 512, False, True, "torch.bfloat16"): backward_pass,
            (36_096, 1376, 512, 512, False, True, "torch.bfloat16"): elsewhere,  # other tokens: left out
        },
    )
    assert bench.tiles_chosen({"hidden": hidden}, 44_000) == (
        "hidden[RECOMPUTE_A=1,HAS_DY=0]: BLOCK_M=128,BLOCK_F=128,warps=8,stages=3; "
        "hidden[RECOMPUTE_A=0,HAS_DY=1]: BLOCK_M=64,BLOCK_F=256,warps=8,stages=4"
    )
    assert bench.tiles_chosen({"hidden": _tuner(hidden_keys, {})}, 44_000) == ""


def test_report_lists_tiles_only_where_rows_have_them():
    rows = pd.DataFrame(
        {
            "shape": ["mid", "mid"],
            "variant": ["eager", "fused"],
            "tiles": [None, "fwd[SAVE_PREACT=1]: BLOCK_M=64,warps=8,stages=3"],
        }
    )
    table = report._tiles_table(rows)
    assert "fused" in table and "SAVE_PREACT=1" in table and "eager" not in table
    assert report._tiles_table(rows.drop(columns="tiles")) == ""
    assert report._tiles_table(rows.iloc[:1]) == ""
