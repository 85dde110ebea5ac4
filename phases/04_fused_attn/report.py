"""Renders reports/04_fused_attn.md with phase 02's attention renderer and this phase's goals.

Runs on different GPUs (an H100, an H200) are never compared with each other: each GPU gets its
own section, tables and goal verdicts, newest first.
"""

import importlib

from common.report import Figures

render_attention = importlib.import_module("phases.02_attn_fwd.report").render_attention

GOALS = [
    ("triton-fused", "mid", "sdpa-cudnn", 1.1),
    ("triton-fused", "large", "sdpa-cudnn", 1.1),
    ("triton-fused", "small", "sdpa-cudnn", 1.5),
]


def render(df, fig):
    gpus = df.groupby("gpu")["utc"].max().sort_values(ascending=False).index
    if len(gpus) < 2:
        return render_attention(df, fig, title="Forward + fused backward", goals=GOALS)
    parts = []
    for i, gpu in enumerate(gpus):
        # Figures of older GPUs get their own file names, so that no plot overwrites another.
        gpu_fig = fig if i == 0 else Figures(f"{fig.phase}_{gpu.split()[1].lower()}", fig.root)
        parts += [
            f"# On the {gpu}\n",
            render_attention(
                df.loc[df["gpu"] == gpu], gpu_fig, title="Forward + fused backward", goals=GOALS
            ),
        ]
    return "\n".join(parts)
