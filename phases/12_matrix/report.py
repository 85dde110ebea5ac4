"""reports/12_matrix.md: per shape, the fastest custom variant against the best baseline (the goals),
then tokens/s per variant and shape, where the step's time goes, the loss curves, and every row."""

import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from common.report import (  # noqa: E402
    Figures,
    PhaseReport,
    Verdict,
    add_ratio,
    failures_table,
    markdown_table,
    ok_table,
    select_verdict_runs,
    write_atomically,
)

TITLE = "12_matrix — the TransformerNP end to end: SDPA baselines against our kernels, eager and compiled"
SHAPE_ORDER = {"tiny": 0, "small": 1, "mid": 2, "large": 3}
BASELINES = ("sdpa-cudnn", "sdpa-flash", "compile+sdpa-cudnn", "compile+sdpa-flash", "sdpa-math")
# small: against the best baseline; mid and large: against the best of eager/compiled sdpa-cudnn.
GOALS = {"small": 1.2, "mid": 1.15, "large": 1.15}
GOAL_BASELINES = {"small": BASELINES, "mid": ("sdpa-cudnn", "compile+sdpa-cudnn"),
                  "large": ("sdpa-cudnn", "compile+sdpa-cudnn")}  # fmt: skip
# sdpa-math is a reference, not a baseline a user would pick: a run may leave it out.
NEEDED_BASELINES = {
    shape: tuple(b for b in names if b != "sdpa-math") for shape, names in GOAL_BASELINES.items()
}
TABLE = ["shape", "batch", "dtype", "variant", "step_ms", "step_p20_ms", "step_p80_ms", "forward_ms",
         "backward_ms", "optimizer_ms", "tokens_per_s", "peak_mem_gb", "speedup_vs_sdpa_cudnn",
         "speedup_vs_best_baseline", "loss_rel_err", "grad_max_rel_err", "loss_first", "loss_last",
         "loss_lowered"]  # fmt: skip


def _prepare(df: pd.DataFrame) -> pd.DataFrame:
    """Per GPU, shape and dtype, the rows of one run (measured side by side): the newest that lacks
    no baseline known to beat the ones it has (``select_verdict_runs``), so that a run of a few
    variants (a loss check) does not hide a complete one."""
    if df.empty or "base_variant" not in df:
        return pd.DataFrame()
    df = df.assign(step_ms=pd.to_numeric(df["step_ms"], errors="coerce"))
    custom = sorted(set(df.loc[~df["base_variant"].isin(BASELINES), "variant"]))
    keep = select_verdict_runs(df, ["shape", "dtype"], ours=custom, metric="step_ms")
    return _speedups(keep.assign(order=keep["shape"].map(SHAPE_ORDER).fillna(9)))


def _newest_per_variant(df: pd.DataFrame) -> pd.DataFrame:
    """Each (GPU, shape, dtype, variant)'s newest ok row: a loss curve depends on the variant, the seed
    and the data, not on what ran beside it, so each variant shows its newest one."""
    ok = df.loc[df["status"] == "ok"]
    newest = ok.groupby(["gpu", "shape", "dtype", "variant"], dropna=False)["utc"].transform("max")
    return ok.loc[ok["utc"] == newest].assign(order=lambda d: d["shape"].map(SHAPE_ORDER).fillna(9))


def _speedups(df: pd.DataFrame) -> pd.DataFrame:
    """The speedup columns from the run group's own rows, per shape, dtype, checkpoint mode and graph
    toggle: a Slurm matrix measures each variant in a task of its own, so a row may carry none."""
    df = df.copy()
    step = pd.to_numeric(df["step_ms"], errors="coerce").where(df["status"] == "ok")
    base = step.where(df["base_variant"].isin(BASELINES))
    cudnn = step.where(df["base_variant"] == "sdpa-cudnn")
    keys = [df[c].astype(str) for c in ("shape", "dtype", "checkpoint", "graphs")]
    df["speedup_vs_sdpa_cudnn"] = cudnn.groupby(keys).transform("min") / step
    df["speedup_vs_best_baseline"] = base.groupby(keys).transform("min") / step
    return df


def _ok(part: pd.DataFrame) -> pd.DataFrame:
    ok = part.loc[part["status"] == "ok"].copy()
    ok["tokens_per_s"] = ok["tokens_per_s"].astype(float)
    return ok


def _best(rows: pd.DataFrame) -> pd.Series | None:
    return None if rows.empty else rows.loc[rows["tokens_per_s"].idxmax()]


def headline_rows(df: pd.DataFrame) -> list[dict]:
    """Per shape and dtype: the fastest custom row and the best goal baseline row, and their ratio."""
    out = []
    for (_, shape, dtype), part in df.groupby(["order", "shape", "dtype"], sort=True):
        ok = _ok(part)
        custom = _best(ok.loc[~ok["base_variant"].isin(BASELINES)])
        base = _best(ok.loc[ok["base_variant"].isin(GOAL_BASELINES.get(shape, BASELINES))])
        ratio = (
            float(custom["tokens_per_s"]) / float(base["tokens_per_s"])
            if custom is not None and base is not None
            else float("nan")
        )
        # A run without one of the goal's baselines has no verdict: the missing one may be the best.
        # A graphed (or checkpointed) cell of a baseline counts as that baseline measured.
        missing = [b for b in NEEDED_BASELINES.get(shape, ()) if b not in set(ok["base_variant"])]
        out.append({"shape": shape, "dtype": dtype, "custom": custom, "base": base, "ratio": ratio,
                    "missing": missing, "goal": GOALS.get(shape), "gpu": part["gpu"].iloc[0],
                    "utc": part["utc"].max()})  # fmt: skip
    return out


def _verdict_ratio(h: dict) -> float:
    return float("nan") if h["missing"] else h["ratio"]


def _baseline_name(h: dict) -> str:
    name = "not measured" if h["base"] is None else h["base"]["variant"]
    return name + (f" ({', '.join(h['missing'])} not run)" if h["missing"] else "")


def _headline_table(df: pd.DataFrame) -> str:
    rows = []
    for h in headline_rows(df):
        custom, base, goal = h["custom"], h["base"], h["goal"]
        verdict = Verdict("12_matrix", "", "", "", _verdict_ratio(h), goal, h["gpu"], h["utc"]).verdict()
        if h["missing"]:
            verdict = f"no verdict: {', '.join(h['missing'])} not run"
        rows.append({
            "shape": h["shape"], "dtype": h["dtype"],
            "fastest custom": "not measured" if custom is None else custom["variant"],
            "custom tokens/s": "" if custom is None else f"{float(custom['tokens_per_s']):,.0f}",
            "best baseline": _baseline_name(h),
            "baseline tokens/s": "" if base is None else f"{float(base['tokens_per_s']):,.0f}",
            "speedup": "not measured" if pd.isna(h["ratio"]) else f"{h['ratio']:.2f}×",
            "goal": "" if goal is None else f"≥ {goal:g}×",
            "verdict": verdict,
        })  # fmt: skip
    return markdown_table(pd.DataFrame(rows)) if rows else "_not measured_\n"


def _save(fig_obj, figs: Figures, name: str, title: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{figs.phase}_{name}")
    path = figs.root / "figures" / f"{slug}.png"
    fig_obj.tight_layout()
    write_atomically(path, lambda tmp: fig_obj.savefig(tmp, dpi=110, format="png"))
    plt.close(fig_obj)
    return f"![{title}](figures/{path.name})\n"


def _tokens_figure(df: pd.DataFrame, figs: Figures) -> str:
    ok = _ok(df)
    if ok.empty:
        return "_tokens/s: not measured_\n"
    table = ok.pivot_table(index="variant", columns="shape", values="tokens_per_s", aggfunc="max")
    table = table[sorted(table.columns, key=lambda s: SHAPE_ORDER.get(s, 9))]
    fig, axes = plt.subplots(1, len(table.columns), figsize=(4.5 * len(table.columns), 4.5), squeeze=False)
    for ax, shape in zip(axes[0], table.columns, strict=True):
        col = table[shape].dropna().sort_values()
        ax.barh(col.index, col.values, color=["C1" if v.startswith(BASELINES) else "C0" for v in col.index])
        ax.set_xlim(left=0)
        ax.set(title=shape, xlabel="tokens/s (training step)")
        ax.tick_params(axis="y", labelsize=7)
    title = "Tokens/s per variant and shape" + (f" — {figs.gpu}" if figs.gpu else "")
    fig.suptitle(title, fontsize=10)
    return _save(fig, figs, "tokens_per_s", title)


def _stages_figure(df: pd.DataFrame, figs: Figures) -> str:
    ok = _ok(df)
    stages = ["forward_ms", "backward_ms", "optimizer_ms"]
    if ok.empty or not set(stages) <= set(ok):
        return "_per-stage times: not measured_\n"
    ok = ok.dropna(subset=stages).sort_values(["order", "variant"])
    if ok.empty:
        return "_per-stage times: not measured_\n"
    labels = [f"{r.shape}\n{r.variant}" for r in ok.itertuples()]
    fig, ax = plt.subplots(figsize=(max(7, 0.6 * len(labels)), 5))
    bottom = pd.Series(0.0, index=ok.index)
    for stage in stages:
        values = ok[stage].astype(float)
        ax.bar(labels, values, bottom=bottom, label=stage.removesuffix("_ms"))
        bottom += values
    ax.set_ylim(bottom=0)
    ax.set_ylabel("ms per training step (median of each stage)")
    ax.tick_params(axis="x", labelsize=6, rotation=90)
    ax.legend(fontsize=8)
    title = "Where the step's time goes" + (f" — {figs.gpu}" if figs.gpu else "")
    ax.set_title(title, fontsize=10)
    return _save(fig, figs, "stages", title)


def _loss_figure(df: pd.DataFrame, figs: Figures) -> str:
    ok = df.loc[(df["status"] == "ok")]
    if ok.empty or "loss_curve" not in ok:
        return ""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    drawn = 0
    for r in ok.itertuples():
        curve = [float(x) for x in str(r.loss_curve).split(";") if x not in ("", "nan")]
        if curve:
            ax.plot(range(1, len(curve) + 1), curve, label=f"{r.shape} {r.variant}", lw=1)
            drawn += 1
    if not drawn:
        plt.close(fig)
        return ""
    ax.set(xlabel="training step", ylabel="loss (GMM NLL)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    title = "Loss curves on the synthetic task" + (f" — {figs.gpu}" if figs.gpu else "")
    ax.set_title(title, fontsize=10)
    return _save(fig, figs, "loss_curves", title)


def _checkpoint_table(df: pd.DataFrame) -> str:
    """Per shape, the newest run that measured a checkpoint mode: each variant's step and peak memory
    with every mode against the same variant without checkpointing, side by side in that run."""
    if "checkpoint" not in df or "base_variant" not in df:
        return ""
    ok = df.loc[(df["status"] == "ok") & (df["graphs"].astype(str) == "False")]
    ok = ok.assign(step_ms=pd.to_numeric(ok["step_ms"], errors="coerce"))
    with_modes = ok.loc[ok["checkpoint"].astype(str) != "none"]
    if with_modes.empty:
        return ""
    newest = with_modes.groupby("shape")["run_id"].max()
    rows = ok.loc[ok["run_id"] == ok["shape"].map(newest)]
    keys = ["shape", "dtype", "batch", "base_variant"]
    rows = add_ratio(rows, keys, rows["checkpoint"] == "none", "step_ms", "step_vs_none")
    rows = add_ratio(rows, keys, rows["checkpoint"] == "none", "peak_mem_gb", "memory_vs_none")
    rows = rows.assign(variant=rows["base_variant"], order=rows["shape"].map(SHAPE_ORDER).fillna(9))
    columns = [
        "shape",
        "batch",
        "variant",
        "checkpoint",
        "step_ms",
        "peak_mem_gb",
        "step_vs_none",
        "memory_vs_none",
    ]
    return (
        "\n## With activation checkpointing\n\nThe newest run per shape that measured checkpoint modes "
        "(`--checkpoint`; phase 09 says what each mode recomputes): step time and peak memory against the "
        "same variant without checkpointing in that run. Each checkpointed variant matched the reference "
        "model like the others before it was timed.\n\n"
        + markdown_table(rows.sort_values(["order", "base_variant", "step_ms"]), columns)
    )


def _gpu_table(df: pd.DataFrame) -> str:
    """The GPU's time a step by kernel family, for the rows that were profiled (``--profile-steps``)."""
    if "gpu_busy_ms" not in df:
        return ""
    busy = pd.to_numeric(df["gpu_busy_ms"], errors="coerce")
    rows = df.loc[(df["status"] == "ok") & busy.notna()].copy()
    if rows.empty:
        return ""
    rows["gpu_idle_pct"] = 100 * (1 - busy / pd.to_numeric(rows["step_ms"], errors="coerce"))
    families = [
        c for c in rows.columns
        if c.startswith("gpu_") and c.endswith("_ms") and c not in ("gpu_busy_ms", "gpu_kernel_ms")
        and pd.to_numeric(rows[c], errors="coerce").fillna(0).gt(0).any()
    ]  # fmt: skip
    columns = ["shape", "variant", "step_ms", "gpu_busy_ms", "gpu_idle_pct", "gpu_launches", *families]
    return (
        "\n### The GPU's time a step, by kernel family\n\n"
        "From `torch.profiler` over a few steps after the timed ones (`--profile-steps`): `gpu_busy_ms` is "
        "the time the GPU ran any kernel, `gpu_idle_pct` the share of the step it waited (on the host, "
        "where the step is launch-bound), then each family's kernel time (`common.step.KERNEL_FAMILIES`: "
        "`attention` our kernels or cuDNN's/flash's, `mlp`, `heads` and `loss` ours, `gemm` cuBLAS, "
        "`inductor` torch.compile's generated kernels).\n\n"
        + markdown_table(rows.sort_values(["order", "step_ms"]), [c for c in columns if c in rows])
    )


# Opens as 09's and 10's renders do (a three-line guard, then the heading); the rest is this phase's own.
def render(df: pd.DataFrame, fig: Figures) -> str:
    curves = _newest_per_variant(df) if "base_variant" in df else df
    checkpointed = _checkpoint_table(df)
    df = _prepare(df)
    if df.empty:
        return "_no rows of this phase_\n"
    return (
        "## Fastest custom variant against the best baseline\n\n"
        + _headline_table(df)
        + "\nGoals: small ≥ 1.2× the best baseline; mid and large ≥ 1.15× the best of eager/compiled "
        "`sdpa-cudnn` (tokens/s, side by side in one run). Every variant's loss and gradients matched the "
        "reference model within the README's tolerance before it was timed; a mismatch is an error row.\n\n"
        "## Tokens/s per variant and shape\n\n" + _tokens_figure(df, fig)
        + "\n## Where the time goes\n\n" + _stages_figure(df, fig) + _gpu_table(df)
        + "\n## Loss curves\n\nEach variant's newest curve (same seed and data in every run; its run may "
        "differ from the one timed above).\n\n" + (_loss_figure(curves, fig) or "_no loss curve recorded_\n")
        + checkpointed
        + "\n## Every step measured\n\n"
        + ok_table(df, TABLE, sort_by=["order", "dtype", "variant"], none="_no step measured_\n")
        + failures_table(df)
    )  # fmt: skip


def headline(df: pd.DataFrame) -> list[Verdict]:
    df = _prepare(df)
    if df.empty:
        return []
    return [
        Verdict(
            "12_matrix",
            f"fastest custom / best baseline tokens/s, {h['shape']}, {h['dtype']}",
            "not measured" if h["custom"] is None else h["custom"]["variant"],
            _baseline_name(h),
            _verdict_ratio(h),
            h["goal"],
            h["gpu"],
            h["utc"],
        )  # fmt: skip
        for h in headline_rows(df)
    ]


REPORT = PhaseReport("12_matrix", TITLE, render, headline)
