"""Renders reports/04_fused_attn.md: forward + fused backward against the two-pass backward and SDPA,
the ncu profile, and the headline verdicts."""

from common.attention_bench import attention_report

PHASE = "04_fused_attn"
# Issue 18: forward + backward >= 1.05x the best SDPA backend (cuDNN) at mid and large, and
# >= 1.0x at small -- on a plain call and as a CUDA-graph replay.
GOALS = [
    ("triton-fused", "mid", "fwd+bwd", 1.05),
    ("triton-fused", "large", "fwd+bwd", 1.05),
    ("triton-fused", "small", "fwd+bwd", 1.0),
    ("triton-fused", "small", "fwd+bwd graphed", 1.0),
]

REPORT = attention_report(
    PHASE,
    "04_fused_attn — the fused attention backward: one pass over the score tiles",
    section="Forward + fused backward",
    goals=GOALS,
    profile=True,
)
headline = REPORT.headline
