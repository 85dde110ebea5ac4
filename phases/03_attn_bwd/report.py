"""Renders reports/03_attn_bwd.md: forward + two-pass backward against SDPA, and its headline verdicts."""

from common.attention_bench import attention_report

PHASE = "03_attn_bwd"
# Forward + backward >= 1.0x the best SDPA backend (cuDNN) at mid and large (README, issue 18), for
# the two-pass backward and for our forward with cuDNN's backward.
GOALS = [
    (variant, shape, "fwd+bwd", 1.0)
    for variant in ("triton-2pass", "triton+cudnn-bwd")
    for shape in ("mid", "large")
]

REPORT = attention_report(
    PHASE,
    "03_attn_bwd — attention backward in two passes, deterministic",
    section="Forward + two-pass backward",
    goals=GOALS,
)
headline = REPORT.headline
