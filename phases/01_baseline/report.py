"""reports/01_baseline.md: the verdict, step time, tokens/s, stages, memory, speedups, loss curve."""

import pandas as pd

from common.report import (  # much the same list as other modules': a declaration, not logic
    Figures,
    PhaseReport,
    Verdict,
    add_speedup,
    best_baseline_verdict,
    failures_table,
    markdown_table,
    select_latest,
)

TITLE = "01_baseline — the TransformerNP on PyTorch SDPA"
# The fastest eager backend on the H100 (README): every speedup in this report is against it.
BASELINE = "eager+sdpa-cudnn"
SPEEDUP = "speedup_vs_eager_cudnn"
SHAPE_ORDER = {"tiny": 0, "small": 1, "mid": 2, "large": 3}
H100_MEMORY_GB = 80


def _step_table(df: pd.DataFrame) -> str:
    steps = df.loc[df["variant"].str.startswith(("eager", "compile"))]
    steps = select_latest(steps, ["variant", "shape", "dtype", "batch"])
    ok = steps.loc[steps["status"] == "ok"]
    if ok.empty:
        return "_no training-step rows_\n"
    ok = add_speedup(ok, ["shape", "dtype", "batch"], BASELINE, metric="step_ms", column=SPEEDUP)
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
        SPEEDUP,
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
        f"memory.\n"
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
        title=f"Training loss, {latest['dtype'].iloc[0]}, shape {latest['shape'].iloc[0]} (fresh tasks every step)",
        ylabel="mean NLL per target",
    )
    return (
        f"\n## Training\n\nLoss from {first:.3f} (first logged window) to {last:.3f} after "
        f"{int(latest['step'].max())} steps at shape {latest['shape'].iloc[0]}.\n\n{plot}"
    )


def render(df: pd.DataFrame, fig: Figures) -> str:
    intro = (
        "One training step (forward, backward, fused AdamW) of the 12-layer TransformerNP under bf16 autocast, "
        f"per SDPA backend, eager and `torch.compile`. `{SPEEDUP}` is `{BASELINE}`'s step time over the row's, measured in the same run.\n\n"
        "Stage times are medians of CUDA-event intervals inside the step; `step_ms` is the median whole step.\n\n"
    )
    return "## Training step\n\n" + intro + _step_table(df) + _memory_note(df) + _loss_curve(df, fig)


def headline(df: pd.DataFrame) -> list[Verdict]:
    """torch.compile against eager, both on cuDNN attention, at the small shape in bf16 (no goal:
    this phase is the baseline the others are measured against)."""
    verdict = best_baseline_verdict(
        "01_baseline",
        df,
        cell="training step, small, bf16",
        where={"shape": "small", "dtype": "bf16"},
        ours="compile+sdpa-cudnn",
        baselines=[BASELINE],
        goal=None,
        metric="step_ms",
    )
    return [verdict] if verdict is not None else []


REPORT = PhaseReport("01_baseline", TITLE, render, headline)
