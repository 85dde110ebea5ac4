"""reports/08_gmm_logprob.md: the loss kernels against eager, torch.compile and a copy of the same bytes,
called through autograd and, where measured, as CUDA-graph replays."""

import pandas as pd

from common.fwd_bwd import KEYS, dtype_names, fwd_bwd_verdicts, render_sweep
from common.report import (
    Figures,
    PhaseReport,
    Verdict,
    add_speedup,
    failures_table,
    markdown_table,
    select_latest,
)

PHASE = "08_gmm_logprob"
GOAL_VS_EAGER, GOAL_OF_COPY = 5.0, 0.8  # the README's goals: ≥ 5× eager, ≥ 80% of the copy's bandwidth


def _modes(df: pd.DataFrame) -> pd.Series:
    """Rows from before graphed mode existed have no mode: they were autograd calls."""
    return df["mode"].fillna("autograd") if "mode" in df else pd.Series("autograd", index=df.index)


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
        verdict = "met" if of_copy >= GOAL_OF_COPY and vs_eager >= GOAL_VS_EAGER else "missed"
        lines.append(
            f"- {_label(shape, part)}: {of_copy:.0%} of the copy's bandwidth (goal {GOAL_OF_COPY:.0%}; "
            f"{kernels_of_copy:.0%} counting the separately timed forward and backward, without autograd's "
            f"host time between them), {vs_eager:.1f}× eager (goal {GOAL_VS_EAGER:g}×): **{verdict}**"
        )
    return lines


def _graphed_goal_lines(ok: pd.DataFrame) -> list[str]:
    lines = []
    for shape, part in ok.groupby("shape", sort=False):
        fused = part.loc[part["variant"] == "fused"]
        if fused.empty or fused[["speedup_vs_eager", "speedup_vs_copy"]].isna().any(axis=None):
            continue  # no graphed eager or copy in fused's run to compare with
        of_copy, vs_eager = fused["speedup_vs_copy"].iloc[0], fused["speedup_vs_eager"].iloc[0]
        verdict = "met" if of_copy >= GOAL_OF_COPY and vs_eager >= GOAL_VS_EAGER else "missed"
        lines.append(
            f"- {_label(shape, part)}: {of_copy:.0%} of the graphed copy's bandwidth (goal {GOAL_OF_COPY:.0%}), "
            f"{vs_eager:.1f}× graphed eager (goal {GOAL_VS_EAGER:g}×): **{verdict}**"
        )
    return lines


def render_graphed(graphed: pd.DataFrame) -> str:
    """Every variant's forward+backward as a CUDA-graph replay, against graphed eager and the graphed
    copy of the same run."""
    graphed = select_latest(graphed, KEYS)
    ok = graphed.loc[graphed["status"] == "ok"].copy()
    parts = [
        "\n## As CUDA-graph replays\n",
        "The same forward+backward (`autograd.grad` of the loss) captured once in a CUDA graph and "
        "replayed, as a graphed training step runs it: no Python or autograd work per call, so at the "
        "model's token counts this compares the kernels, where the calls above compare the host's time. "
        "Each replay was checked first (fresh inputs, poisoned gradient) against a float32 reference. "
        "Speedups are against graphed rows of the same run; `speedup_vs_copy` is the copy's time over "
        "this row's, the same bytes moved: the share of the copy's bandwidth.\n",
    ]
    if ok.empty:
        return "\n".join([*parts, "_no successful rows_\n", failures_table(graphed)])
    ok = add_speedup(ok, ["shape", "dtype"], "eager", "fwd_bwd_ms")
    ok = add_speedup(ok, ["shape", "dtype"], "copy", "fwd_bwd_ms")
    ok = ok.sort_values(["targets", "fwd_bwd_ms"])
    columns = [
        *["shape", "targets", "variant", "fwd_bwd_ms", "fwd_bwd_gbps"],
        *["speedup_vs_eager", "speedup_vs_copy", "err_grad"],
    ]
    parts += [
        "### Goals (graphed forward+backward)\n",
        "\n".join(_graphed_goal_lines(ok)) or "_not measured yet_",
        "\n### All graphed cells\n",
        markdown_table(ok, columns),
        failures_table(graphed),
    ]
    return "\n".join(parts)


def headline(df: pd.DataFrame) -> list[Verdict]:
    """The fused loss against eager (goal 5×) and against the copy of the same bytes (goal 80% of its
    bandwidth): graphed at mid, the model's size, where a replay measures the kernels; through autograd
    at T = 4 194 304, where the kernels outweigh the host's time."""
    modes = _modes(df)
    graphed, autograd = df.loc[modes == "graphed"], df.loc[modes != "graphed"]
    cells = [
        (graphed, "mid", "mid, graphed", ["eager"], GOAL_VS_EAGER),
        (graphed, "mid", "mid, graphed, share of copy", ["copy"], GOAL_OF_COPY),
        (autograd, "T=4194304", "T=4194304, autograd", ["eager"], GOAL_VS_EAGER),
        (autograd, "T=4194304", "T=4194304, autograd, share of copy", ["copy"], GOAL_OF_COPY),
    ]
    return fwd_bwd_verdicts(PHASE, "fused", cells)


def render(df: pd.DataFrame, fig: Figures) -> str:
    # Split before render_sweep, which keeps the newest row per variant, shape and dtype regardless of mode.
    modes = _modes(df)
    graphed = df.loc[modes == "graphed"]
    dtypes = dtype_names(df)
    # render_sweep's arguments, with this phase's values: 06-08's calls share their shape, not their content.
    sweep = render_sweep(
        df.loc[modes != "graphed"],
        fig,
        size="targets",
        throughput="fwd_bwd_gbps",
        baselines=["eager"],
        sort_by=["targets", "fwd_bwd_ms"],
        intro=f"Mean mixture NLL over T targets × 10 components, {dtypes} params, forward+backward. GB/s counts "
        "the minimum traffic -- params and y read by the forward and again by the backward, d params "
        "written once -- for every variant; `copy` is a device-to-device copy of that many bytes, the "
        "ceiling. The fused forward+backward is two launches, the copy one. Times are medians (ms).\n",
        goal_lines=_goal_lines,
        memory=("peak_mb",),
        plot={
            "y": "fwd_bwd_gbps",
            "name": "gbps",
            "title": f"GMM NLL forward+backward, {dtypes}, every row count",
            "ylabel": "GB/s",
        },
    )
    return sweep + (render_graphed(graphed) if not graphed.empty else "")


REPORT = PhaseReport(
    PHASE, "08 · GMM negative log-likelihood: one kernel forward, one kernel backward", render, headline
)
