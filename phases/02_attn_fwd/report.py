"""Renders reports/02_attn_fwd.md; phases 03 and 04 reuse ``render_attention`` with their own goals."""

import pandas as pd

from common.report import Figures, add_speedup, failures_table, markdown_table, select_latest

KEYS = ["variant", "shape", "mode"]
TNP_SHAPES = ["small", "mid", "large", "tiny"]
# The columns of each table, where the rows have them (older runs lack some).
MEASURED = ["ms", "tflops", "x_vs_cudnn", "x_vs_flash", "peak_mem_gb"]
TNP_COLUMNS = ["variant", "shape", "mode", "batch", "lq", "lk", *MEASURED, "call_mem_gb", "err_o", "config"]
SWEEP_COLUMNS = ["variant", "batch", "lq", "lk", *MEASURED]
CONFIG_COLUMNS = [
    "variant",
    "shape",
    "config",
    "dkdv_config",
    "dq_config",
    "fused_config",
    "n_regs",
    "n_spills",
]


def _present(columns: list[str], df: pd.DataFrame) -> list[str]:
    return [c for c in columns if c in df]


def _speedups(df: pd.DataFrame) -> pd.DataFrame:
    for base in ("sdpa-cudnn", "sdpa-flash"):
        df = add_speedup(df, ["shape", "mode"], base, "ms", f"x_vs_{base.split('-')[1]}")
    return df


def goals_table(df: pd.DataFrame, goals: list[tuple]) -> str:
    """goals: (variant, shape, baseline, required speedup[, mode]) -> one line each, met or missed
    by how much. Without a mode, the plain call's row (not a CUDA-graph replay)."""
    lines = ["| goal | measured | verdict |", "|---|---|---|"]
    for variant, shape, baseline, need, *mode in goals:
        col = f"x_vs_{baseline.split('-')[1]}"
        wanted = (df["mode"] == mode[0]) if mode else ~df["mode"].str.endswith("graphed")
        row = df.loc[(df["variant"] == variant) & (df["shape"] == shape) & (df["status"] == "ok") & wanted]
        goal = f"{variant} ≥ {need:.2f}× {baseline} at {shape}" + (f" ({mode[0]})" if mode else "")
        if row.empty or pd.isna(row[col].iloc[0]):
            lines.append(f"| {goal} | not measured | — |")
            continue
        got = float(row[col].iloc[0])
        verdict = "met" if got >= need else f"missed by {100 * (1 - got / need):.0f}%"
        lines.append(f"| {goal} | {got:.2f}× | {verdict} |")
    return "\n".join(lines) + "\n"


def render_attention(df: pd.DataFrame, fig: Figures, *, title: str, goals) -> str:
    df = _speedups(select_latest(df, KEYS))
    ok = df.loc[df["status"] == "ok"]
    cols = _present(TNP_COLUMNS, df)
    parts = [
        f"## {title}: TransformerNP shapes (H = 8, D = 64, bf16)\n",
        "TFLOP/s count the forward as 4·B·H·Lq·Lk·D and the backward as 2.5× that; `x_vs_*` is "
        "the SDPA backend's time over this row's, measured in the same run. `err_o` is the max "
        "abs error of the output against SDPA cuDNN, checked before timing (and, with a backward, "
        "dq, dk, dv within 3% of the largest SDPA gradient). `peak_mem_gb` is the device's peak "
        "during one call, inputs included -- and, in every row after a run's first, the 0.27 GB "
        "L2-flush buffer of `common.bench` (the first row of a run reads 0.27 GB lower); newer rows "
        "add `call_mem_gb`, what the call itself allocates. A mode ending in `graphed` times a replay of the "
        "same call captured in a CUDA graph, for every implementation alike: no host work per call, so it "
        "compares the kernels where the plain call is bound by the host.\n",
        markdown_table(ok.loc[ok["shape"].isin(TNP_SHAPES)].sort_values(["shape", "ms"]), cols),
    ]
    parts += ["\n### Goals\n", goals_table(df, goals)]
    sweep = ok.loc[ok["shape"].str.startswith("sweep")]
    if not sweep.empty:
        parts += [
            "\n## Sweep over Lk (Lq = 1.1·Lk, H = 8, B·H·Lq ≈ 1.76 M query rows)\n",
            fig.line_plot(
                sweep,
                x="lk",
                y="tflops",
                series="variant",
                name="sweep_tflops",
                title=f"{title}: TFLOP/s against Lk",
                xlabel="Lk (keys)",
                ylabel="TFLOP/s",
                logx=True,
            ),
            markdown_table(sweep.sort_values(["lk", "variant"]), _present(SWEEP_COLUMNS, sweep)),
        ]
    configs = ok.loc[ok["variant"].str.startswith("triton"), _present(CONFIG_COLUMNS, ok)]
    if not configs.empty:
        parts += [
            "\n## Autotuned configs chosen per shape (search spaces in the phase README)\n",
            markdown_table(configs.drop_duplicates()),
        ]
    return "\n".join(parts) + failures_table(df)


def render(df: pd.DataFrame, fig: Figures) -> str:
    goals = [("triton", "mid", "sdpa-cudnn", 1.1), ("triton", "large", "sdpa-cudnn", 1.1)]
    return render_attention(df, fig, title="Forward", goals=goals)
