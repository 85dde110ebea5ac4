"""Renders reports/04_fused_attn.md: forward + fused backward against the two-pass backward and SDPA,
the ncu profile, and the headline verdicts."""

from dataclasses import replace

import pandas as pd

from common.attention_bench import attention_report, attention_verdicts
from common.report import Verdict, best_baseline_verdict

PHASE = "04_fused_attn"
# Issue 18: forward + backward >= 1.05x the best SDPA backend (cuDNN) at mid and large, and
# >= 1.0x at small -- on a plain call and as a CUDA-graph replay.
GOALS = [
    ("triton-fused", "mid", "fwd+bwd", 1.05),
    ("triton-fused", "large", "fwd+bwd", 1.05),
    ("triton-fused", "small", "fwd+bwd", 1.0),
    ("triton-fused", "small", "fwd+bwd graphed", 1.0),
]
# ... and faster than the two-pass backward (phase 03) at every shape, in the same run.
TWO_PASS_CELLS = [
    ("mid", "fwd+bwd"),
    ("large", "fwd+bwd"),
    ("small", "fwd+bwd"),
    ("small", "fwd+bwd graphed"),
]


def headline(df: pd.DataFrame) -> list[Verdict]:
    verdicts = attention_verdicts(PHASE, df, GOALS)
    for shape, mode in TWO_PASS_CELLS:
        verdict = best_baseline_verdict(
            PHASE, df, cell=f"{shape}, {mode}, bf16 (vs the two-pass backward)",
            where={"shape": shape, "mode": mode, "dtype": "bf16"},
            ours="triton-fused", baselines=["triton-2pass"], goal=1.0,
        )  # fmt: skip
        if verdict is not None:
            verdicts.append(verdict)
    return verdicts


REPORT = replace(
    attention_report(
        PHASE,
        "04_fused_attn — the fused attention backward: one pass over the score tiles",
        section="Forward + fused backward",
        goals=GOALS,
    ),
    headline=headline,
)
