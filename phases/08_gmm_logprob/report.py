"""reports/08_gmm_logprob.md: the loss kernels against eager, torch.compile and a copy of the same bytes,
called through autograd and, where measured, as CUDA-graph replays."""

import importlib

import pandas as pd

from common.report import Figures, add_speedup, failures_table, markdown_table, select_latest

sweep_report = importlib.import_module("phases.06_fused_mlp.report")
render_sweep = sweep_report.render_sweep


def _label(shape: str, part: pd.DataFrame) -> str:
    return shape if shape.startswith("T=") else f"{shape} (T={int(part['targets'].iloc[0])})"


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
        lines.append(
            f"- {_label(shape, part)}: {of_copy:.0%} of the copy's bandwidth (goal 80%; "
            f"{kernels_of_copy:.0%} counting the separately timed forward and backward, without autograd's "
            f"host time between them), {vs_eager:.1f}× eager (goal 5×): **{verdict}**"
        )
    return lines


def _graphed_goal_lines(ok: pd.DataFrame) -> list[str]:
    lines = []
    for shape, part in ok.groupby("shape", sort=False):
        fused = part.loc[part["variant"] == "fused"]
        if fused.empty or fused[["speedup_vs_eager", "pct_of_copy"]].isna().any(axis=None):
            continue  # no graphed eager or copy in fused's run to compare with
        of_copy, vs_eager = fused["pct_of_copy"].iloc[0] / 100, fused["speedup_vs_eager"].iloc[0]
        verdict = "met" if of_copy >= 0.8 and vs_eager >= 5 else "missed"
        lines.append(
            f"- {_label(shape, part)}: {of_copy:.0%} of the graphed copy's bandwidth (goal 80%), "
            f"{vs_eager:.1f}× graphed eager (goal 5×): **{verdict}**"
        )
    return lines


def render_graphed(graphed: pd.DataFrame) -> str:
    """Every variant's forward+backward as a CUDA-graph replay, against graphed eager and the graphed
    copy of the same run."""
    graphed = select_latest(graphed, sweep_report.KEYS)
    ok = graphed.loc[graphed["status"] == "ok"].copy()
    parts = [
        "\n## As CUDA-graph replays\n",
        "The same forward+backward (`autograd.grad` of the loss) captured once in a CUDA graph and "
        "replayed, as a graphed training step runs it: no Python or autograd work per call, so at the "
        "model's token counts this compares the kernels, where the calls above compare the host's time. "
        "Each replay was checked first (fresh inputs, poisoned gradient) against a float32 reference. "
        "Speedups and the share of the copy's bandwidth are against graphed rows of the same run.\n",
    ]
    if ok.empty:
        return "\n".join([*parts, "_no successful rows_\n", failures_table(graphed)])
    ok = add_speedup(ok, ["shape", "dtype"], "eager", "fwd_bwd_ms")
    ok = add_speedup(ok, ["shape", "dtype"], "copy", "fwd_bwd_ms", column="pct_of_copy")
    ok["pct_of_copy"] *= 100  # the same bytes, so the time ratio is the bandwidth ratio
    ok = ok.sort_values(["targets", "fwd_bwd_ms"])
    columns = [
        *["shape", "targets", "variant", "fwd_bwd_ms", "fwd_bwd_gbps"],
        *["speedup_vs_eager", "pct_of_copy", "err_grad"],
    ]
    parts += [
        "### Goals (graphed forward+backward)\n",
        "\n".join(_graphed_goal_lines(ok)) or "_not measured yet_",
        "\n### All graphed cells\n",
        markdown_table(ok, columns),
        failures_table(graphed),
    ]
    return "\n".join(parts)


def render(df: pd.DataFrame, fig: Figures) -> str:
    # Rows from before graphed mode existed have no mode: they were autograd calls. Split before
    # render_sweep, which keeps the newest row per variant, shape and dtype regardless of mode.
    mode = df["mode"].fillna("autograd") if "mode" in df else pd.Series("autograd", index=df.index)
    graphed = df.loc[mode == "graphed"]
    sweep = render_sweep(
        df.loc[mode != "graphed"],
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
    return sweep + (render_graphed(graphed) if not graphed.empty else "")
