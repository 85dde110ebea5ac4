"""Markdown for reports/01_baseline.md: step time, tokens/s, stages, memory, speedups, loss curve."""

import pandas as pd

from common.report import Figures, add_speedup, failures_table, markdown_table, select_latest

BASELINE = "eager+sdpa-flash"
SHAPE_ORDER = {"tiny": 0, "small": 1, "mid": 2, "large": 3}
H100_MEMORY_GB = 80


def _step_table(df: pd.DataFrame) -> str:
    steps = df.loc[df["variant"].str.startswith(("eager", "compile"))]
    steps = select_latest(steps, ["variant", "shape", "dtype", "batch"])
    ok = steps.loc[steps["status"] == "ok"]
    if ok.empty:
        return "_no training-step rows_\n"
    ok = add_speedup(ok, ["shape", "dtype", "batch"], BASELINE, metric="step_ms", column="speedup")
    ok = ok.assign(order=ok["shape"].map(SHAPE_ORDER)).sort_values(["gpu", "order", "dtype", "step_ms"])
    cols = [
        "gpu",
        "shape",
        "batch",
        "dtype",
        "variant",
        "step_ms",
        "tokens_per_s",
        "forward_ms",
        "backward_ms",
        "optimizer_ms",
        "peak_mem_gb",
        "speedup",
    ]
    text = markdown_table(ok, cols)
    return text + failures_table(steps)


def _memory_note(df: pd.DataFrame) -> str:
    large = df.loc[(df["shape"] == "large") & (df["status"] == "ok") & df["variant"].str.startswith("eager")]
    if large.empty:
        return ""
    lines = ["\n## Memory at the large shape (M=200 000, N=5 000, B=1)\n"]
    for _, row in large.sort_values("peak_mem_gb").iterrows():
        lines.append(
            f"- {row['variant']} on {row['gpu']}: peak {row['peak_mem_gb']:.1f} GB for forward + backward + "
            f"AdamW ({row['peak_mem_gb'] / H100_MEMORY_GB:.0%} of 80 GB)."
        )
    lowest = large["peak_mem_gb"].min()
    per_layer = lowest / 12
    lines.append(
        f"\nAbout {per_layer:.1f} GB per layer if the peak is mostly saved activations (12 layers, 205 000 tokens "
        f"of width 512 plus the 1365-wide MLP hidden state). The step fits on an 80 GB card without checkpointing; "
        f"on a 40 GB card, or with B > 1, checkpointing each block (keeping only its input, 205 000 × 512 values) "
        f"and recomputing it in the backward trades one extra forward (about a third of the step) for most of that "
        f"memory -- phase 09 measures it.\n"
    )
    return "\n".join(lines)


def _loss_curve(df: pd.DataFrame, fig: Figures) -> str:
    curve = df.loc[df["variant"].str.startswith("train") & (df["status"] == "ok")]
    if curve.empty:
        return ""
    latest = curve.loc[curve["run_group"] == curve.sort_values("utc")["run_group"].iloc[-1]]
    first, last = latest.sort_values("step")["train_loss"].iloc[[0, -1]]
    plot = fig.line_plot(
        latest,
        x="step",
        y="train_loss",
        series="variant",
        name="loss_curve",
        title="Training loss (fresh tasks every step)",
        ylabel="mean NLL per target",
    )
    return (
        f"\n## Training\n\nLoss from {first:.3f} (first logged window) to {last:.3f} after "
        f"{int(latest['step'].max())} steps at shape {latest['shape'].iloc[0]}.\n\n{plot}"
    )


def render(df: pd.DataFrame, fig: Figures) -> str:
    intro = (
        "One training step (forward, backward, fused AdamW) of the 12-layer TransformerNP under bf16 autocast, "
        f"per SDPA backend, eager and `torch.compile`. `speedup` is against `{BASELINE}` measured in the same run.\n\n"
        "Stage times are medians of CUDA-event intervals inside the step; `step_ms` is the median whole step.\n\n"
    )
    return "## Training step\n\n" + intro + _step_table(df) + _memory_note(df) + _loss_curve(df, fig)
