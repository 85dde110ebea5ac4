"""reports/08_gmm_logprob.md: the loss kernels against eager, torch.compile and a copy of the same bytes."""

import importlib

import pandas as pd

from common.report import Figures

render_sweep = importlib.import_module("phases.06_fused_mlp.report").render_sweep


def _goal_lines(ok: pd.DataFrame) -> list[str]:
    lines = []
    for shape, part in ok.groupby("shape", sort=False):
        ms = part.set_index("variant")["fwd_bwd_ms"]
        if not {"eager", "fused", "copy"} <= set(ms.index):
            continue
        of_copy, vs_eager = ms["copy"] / ms["fused"], ms["eager"] / ms["fused"]
        fused = part.set_index("variant").loc["fused"]
        kernels_of_copy = ms["copy"] / (fused["fwd_ms"] + fused["bwd_ms"])
        verdict = "met" if of_copy >= 0.8 and vs_eager >= 5 else "missed"
        label = shape if shape.startswith("T=") else f"{shape} (T={int(part['targets'].iloc[0])})"
        lines.append(
            f"- {label}: {of_copy:.0%} of the copy's bandwidth (goal 80%; "
            f"{kernels_of_copy:.0%} counting the separately timed forward and backward, without autograd's "
            f"host time between them), {vs_eager:.1f}× eager (goal 5×): **{verdict}**"
        )
    return lines


def render(df: pd.DataFrame, fig: Figures) -> str:
    return render_sweep(
        df,
        fig,
        size="targets",
        throughput="fwd_bwd_gbps",
        baselines=["eager"],
        sort_by=["targets", "fwd_bwd_ms"],
        intro="Mean mixture NLL over T targets × 10 components, bf16 params, forward+backward. GB/s counts the "
        "minimum traffic -- params and y read by the forward and again by the backward, d params written "
        "once -- for every variant; `copy` is a device-to-device copy of that many bytes, the ceiling. "
        "The fused forward+backward is two launches, the copy one. Times are medians (ms).\n",
        goal_lines=_goal_lines,
        memory=("peak_mb",),
        plot={
            "y": "fwd_bwd_gbps",
            "name": "gbps",
            "title": "GMM NLL forward+backward, bf16",
            "ylabel": "GB/s",
        },
    )
