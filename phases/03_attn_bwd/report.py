"""Renders reports/03_attn_bwd.md with phase 02's attention renderer and this phase's goals."""

import importlib

render_attention = importlib.import_module("phases.02_attn_fwd.report").render_attention


def render(df, fig):
    goals = [
        ("triton-2pass", "mid", "sdpa-flash", 1.0),
        ("triton-2pass", "large", "sdpa-flash", 1.0),
        ("triton-2pass", "small", "sdpa-cudnn", 1.5),
    ]
    return render_attention(df, fig, title="Forward + two-pass backward", goals=goals)
