"""The attention reports' goal lines: a plain call's row unless the goal names a mode."""

import importlib

import pandas as pd

report = importlib.import_module("phases.02_attn_fwd.report")


def test_goals_pick_the_plain_call_unless_a_mode_is_named():
    df = pd.DataFrame(
        {
            "variant": ["triton-fused", "triton-fused"],
            "shape": ["small", "small"],
            "mode": ["fwd+bwd", "fwd+bwd graphed"],
            "status": ["ok", "ok"],
            "x_vs_cudnn": [1.03, 2.01],
        }
    )
    goals = [
        ("triton-fused", "small", "sdpa-cudnn", 1.5),
        ("triton-fused", "small", "sdpa-cudnn", 1.5, "fwd+bwd graphed"),
    ]
    lines = report.goals_table(df, goals).splitlines()[2:]
    assert "| 1.03× | missed by 31% |" in lines[0]
    assert "(fwd+bwd graphed) | 2.01× | met |" in lines[1]
    assert "not measured" in report.goals_table(df, [("triton", "mid", "sdpa-cudnn", 1.1)])
