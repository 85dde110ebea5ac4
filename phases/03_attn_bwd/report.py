"""Renders reports/03_attn_bwd.md: forward + two-pass backward against SDPA, and its headline verdicts."""

from common.attention_bench import attention_report

PHASE = "03_attn_bwd"
# Forward + backward >= 1.0x the best SDPA backend (cuDNN) at mid and large (README, issue 18).
GOALS = [("triton-2pass", "mid", "fwd+bwd", 1.0), ("triton-2pass", "large", "fwd+bwd", 1.0)]

REPORT = attention_report(
    PHASE,
    "03_attn_bwd — attention backward in two passes, deterministic",
    section="Forward + two-pass backward",
    goals=GOALS,
)
headline = REPORT.headline
