"""Renders reports/04_fused_attn.md with phase 02's attention renderer and this phase's goals."""

import importlib

from common.ncu import render_profile

render_attention = importlib.import_module("phases.02_attn_fwd.report").render_attention

GOALS = [
    ("triton-fused", "mid", "sdpa-cudnn", 1.1),
    ("triton-fused", "large", "sdpa-cudnn", 1.1),
    ("triton-fused", "small", "sdpa-cudnn", 1.5),
    ("triton-fused", "small", "sdpa-cudnn", 1.5, "fwd+bwd graphed"),
]


def render(df, fig):
    profile = render_profile("04_fused_attn", df["gpu"].iloc[0])
    return render_attention(df, fig, title="Forward + fused backward", goals=GOALS) + profile
