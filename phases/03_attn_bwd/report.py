"""Renders reports/03_attn_bwd.md: forward + two-pass backward against SDPA, and its headline verdicts."""

from common.attention_bench import attention_verdicts, render_attention
from common.report import PhaseReport

PHASE = "03_attn_bwd"
# Forward + backward >= 1.0x the best SDPA backend (cuDNN) at mid and large (README, issue 18).
GOALS = [("triton-2pass", "mid", "fwd+bwd", 1.0), ("triton-2pass", "large", "fwd+bwd", 1.0)]


def render(df, fig) -> str:
    return render_attention(df, fig, title="Forward + two-pass backward")


def headline(df):
    return attention_verdicts(PHASE, df, GOALS)


REPORT = PhaseReport(PHASE, "03_attn_bwd — attention backward in two passes, deterministic", render, headline)
