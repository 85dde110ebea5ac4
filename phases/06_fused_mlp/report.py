"""reports/06_fused_mlp.md: the fused MLP against eager and torch.compile, per shape.

``render_sweep`` is the report skeleton phases 07 and 08 use too."""

from collections.abc import Callable

import pandas as pd

from common.ncu import render_profile
from common.report import Figures, add_speedup, failures_table, markdown_table, select_latest

KEYS = ["variant", "shape", "dtype"]
SHAPE_ORDER = {"tiny": 0, "small": 1, "mid": 2, "large": 3}
# Ours: the Triton variants, and eager's cuBLAS GEMMs on padded weights (no Triton: what padding buys).
OURS = ["fused", "fused-recompute", "fused-registers", "gemm-silu+cublas", "padded-cublas"]


def _goal_lines(ok: pd.DataFrame) -> list[str]:
    lines = []
    for shape in ("mid", "large"):
        part = ok.loc[ok["shape"] == shape].set_index("variant")
        if not {"eager", "compile", "fused"} <= set(part.index):
            continue
        for name in [v for v in OURS if v in part.index]:
            vs_eager, vs_compile = part.loc[name, "speedup_vs_eager"], part.loc[name, "speedup_vs_compile"]
            verdict = "met" if vs_eager >= 1.2 and vs_compile >= 1.0 else "missed"
            lines.append(
                f"- {shape}, {name}: {vs_eager:.2f}× eager (goal 1.2×), {vs_compile:.2f}× compile "
                f"(goal 1.0×): **{verdict}**"
            )
    return lines


def render_sweep(
    df: pd.DataFrame,
    fig: Figures,
    *,
    size: str,
    throughput: str,
    baselines: list[str],
    sort_by: list[str],
    intro: str,
    goal_lines: Callable[[pd.DataFrame], list[str]],
    goals_over: str = "forward+backward",
    memory: tuple[str, ...] = ("saved_mb", "peak_mb"),
    plot: dict,
    unplotted: tuple[str, ...] = (),
) -> str:
    """The report of phases 06-08: the latest row of each cell, speedups against the ``baselines`` measured
    in the same run, the goals' verdicts, a table of every cell, a figure over ``size`` (the row count
    column; ``plot`` holds the rest of ``Figures.line_plot``'s arguments, ``unplotted`` the variants it
    leaves out), the failures."""
    df = select_latest(df, KEYS)
    ok = df.loc[df["status"] == "ok"].copy()
    if ok.empty:
        return "_no successful rows_\n" + failures_table(df)
    for baseline in baselines:
        ok = add_speedup(ok, ["shape", "dtype"], baseline, "fwd_bwd_ms")
    ok = ok.sort_values(sort_by, key=lambda s: s.map(SHAPE_ORDER) if s.name == "shape" else s)
    columns = [
        *["shape", size, "variant", "fwd_ms", "bwd_ms", "fwd_bwd_ms", throughput],
        *[f"speedup_vs_{baseline}" for baseline in baselines],
        *memory,
        *["err_out", "err_grad"],
    ]
    parts = [
        intro,
        f"## Goals ({goals_over})\n",
        "\n".join(goal_lines(ok)) or "_not measured yet_",
        "\n## All cells\n",
        markdown_table(ok, columns),
        fig.line_plot(ok.loc[~ok["variant"].isin(unplotted)], x=size, series="variant", logx=True, **plot),
        _tiles_table(ok),
        failures_table(df),
    ]
    return "\n".join(parts)


def _tiles_table(ok: pd.DataFrame) -> str:
    """The tiles the autotuner chose for each Triton cell, where the rows record them."""
    if "tiles" not in ok.columns:
        return ""
    tuned = ok.loc[ok["tiles"].fillna("").astype(str) != ""]
    if tuned.empty:
        return ""
    return "\n## Tiles the autotuner chose\n\n" + markdown_table(tuned, ["shape", "variant", "tiles"])


def render(df: pd.DataFrame, fig: Figures) -> str:
    sweep = render_sweep(
        df,
        fig,
        size="tokens",
        throughput="fwd_bwd_tflops",
        baselines=["eager", "compile"],
        sort_by=["shape", "fwd_bwd_ms"],
        intro="One MLP block, y = silu(x W1ᵀ) W2ᵀ with d_model 512, d_ff 1365, at the MLP's token count of "
        "each shape (B·(M+N)), bf16, forward+backward through autograd. Times are medians (ms); TFLOP/s "
        "counts 12·T·512·1365 useful FLOPs (a recomputed GEMM is not useful work); speedups are against "
        "rows of the same run. `saved_mb` is what the forward keeps for the backward (including its "
        "output); `peak_mb` the peak above the inputs during forward+backward.\n",
        goals_over="forward+backward, mid and large",
        goal_lines=_goal_lines,
        plot={
            "y": "fwd_bwd_tflops",
            "name": "tflops",
            "title": "MLP forward+backward, bf16",
            "ylabel": "TFLOP/s",
        },
    )
    return sweep + render_profile("06_fused_mlp", df["gpu"].iloc[0])
