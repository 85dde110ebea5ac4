"""Renders reports/02_attn_fwd.md: the forward against SDPA, and its headline verdicts."""

from common.attention_bench import attention_report

PHASE = "02_attn_fwd"
# Forward >= 1.1x the best SDPA backend (cuDNN) at mid and large (README, issue 18).
GOALS = [("triton", "mid", "fwd", 1.1), ("triton", "large", "fwd", 1.1)]

REPORT = attention_report(
    PHASE, "02_attn_fwd — rectangular attention forward in Triton", section="Forward", goals=GOALS
)
headline = REPORT.headline
