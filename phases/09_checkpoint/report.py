"""reports/09_checkpoint.md: per shape, whether checkpointing's larger batch pays for its recompute;
then the step at the shape's batch, the largest batch per mode, tokens/s against batch, every probe."""

import pandas as pd

from common.report import Figures, PhaseReport, Verdict, add_ratio, failures_table, markdown_table

TITLE = "09_checkpoint — activation checkpointing: does the larger batch pay for the recompute?"
SHAPE_ORDER = {"tiny": 0, "small": 1, "mid": 2, "large": 3}
MODE_ORDER = {"none": 0, "block": 1, "selective": 2, "mlp": 3}
MEASURED = ("shape", "search")  # the roles of rows that time a step (role "max" sums a search up)


def _prepare(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of this phase with their stack (attention, compiled or not: what checkpointing is
    compared within) and the newest run group per shape, dtype and stack: one side-by-side run."""
    if df.empty or "checkpoint" not in df:
        return pd.DataFrame()
    df = df.loc[df["checkpoint"].astype(str) != ""].copy()
    df["stack"] = [
        v.replace(f"ckpt-{c}+", "", 1) for v, c in zip(df["variant"], df["checkpoint"], strict=True)
    ]
    df["role"] = df["role"].astype(str)
    newest = df.sort_values("utc").groupby(["shape", "dtype", "stack"])["run_group"].last()
    keep = df.join(newest.rename("_newest"), on=["shape", "dtype", "stack"])
    keep = keep.loc[keep["run_group"] == keep["_newest"]].drop(columns="_newest")
    return keep.assign(
        order=keep["shape"].map(SHAPE_ORDER).fillna(9),
        mode_order=keep["checkpoint"].map(MODE_ORDER).fillna(9),
    )


def _timed(df: pd.DataFrame) -> pd.DataFrame:
    ok = df.loc[df["role"].isin(MEASURED) & (df["status"] == "ok")]
    return (
        ok.loc[pd.to_numeric(ok["tokens_per_s"], errors="coerce").notna()]
        if "tokens_per_s" in ok
        else ok.iloc[:0]
    )


def _best(rows: pd.DataFrame) -> pd.Series | None:
    return None if rows.empty else rows.loc[rows["tokens_per_s"].astype(float).idxmax()]


def _groups(df: pd.DataFrame):
    for (_, shape, dtype, stack), part in df.groupby(["order", "shape", "dtype", "stack"], sort=True):
        yield shape, dtype, stack, part


def _label(row: pd.Series) -> str:
    return f"{row['checkpoint']} at B={int(row['batch'])}"


def verdict_lines(df: pd.DataFrame) -> list[str]:
    """One sentence per shape (and dtype, stack): does checkpointing's best tokens/s beat none's?"""
    lines = []
    for shape, dtype, stack, part in _groups(df):
        timed = _timed(part)
        plain = _best(timed.loc[timed["checkpoint"] == "none"])
        ckpt = _best(timed.loc[timed["checkpoint"] != "none"])
        head = f"- **{shape}** ({stack}, {dtype}): "
        if ckpt is None:
            lines.append(head + "no checkpointed step ran; no verdict.")
            continue
        if plain is None:
            lines.append(
                head + f"**checkpointing is the only way this shape runs**: {_label(ckpt)}, "
                f"{ckpt['tokens_per_s']:,.0f} tokens/s; without it every batch tried ran out of memory."
            )
            continue
        ratio = ckpt["tokens_per_s"] / plain["tokens_per_s"]
        pays = "**checkpointing pays**" if ratio >= 1 else "**checkpointing does not pay**"
        lines.append(
            head + f"{pays}: its best, {_label(ckpt)}, reaches {ckpt['tokens_per_s']:,.0f} tokens/s, "
            f"{ratio:.2f}× the best without it ({_label(plain)}, {plain['tokens_per_s']:,.0f} tokens/s)."
            + _search_note(part)
        )
    return lines


def _search_note(part: pd.DataFrame) -> str:
    maxima = part.loc[(part["role"] == "max")]
    if maxima.empty:
        return " (no batch search: the shape's batch only.)"
    capped = maxima.loc[maxima["stopped"].astype(str) == "cap", "checkpoint"].tolist()
    note = " Largest batch: " + ", ".join(
        f"{r['checkpoint']} {int(r['max_batch'])}" for _, r in maxima.sort_values("mode_order").iterrows()
    )
    if capped:
        note += f" ({', '.join(capped)}: the search's ceiling, not memory, stopped it)"
    return note + "."


def _shape_batch_table(df: pd.DataFrame) -> str:
    rows = df.loc[(df["role"] == "shape") & (df["status"] == "ok")].copy()
    if rows.empty:
        return "_no step at the shape's batch_\n"
    keys = ["shape", "dtype", "stack"]
    rows = add_ratio(rows, keys, rows["checkpoint"] == "none", "step_ms", "step_vs_none")
    rows = add_ratio(rows, keys, rows["checkpoint"] == "none", "peak_mem_gb", "memory_vs_none")
    rows = rows.sort_values(["order", "dtype", "stack", "mode_order"])
    cols = ["shape", "batch", "dtype", "stack", "checkpoint", "step_ms", "tokens_per_s", "forward_ms",
            "backward_ms", "peak_mem_gb", "step_vs_none", "memory_vs_none"]  # fmt: skip
    return markdown_table(rows, cols)


def _max_batch_table(df: pd.DataFrame) -> str:
    maxima = df.loc[df["role"] == "max"].copy()
    if maxima.empty:
        return "_no batch search in these rows_\n"
    timed = _timed(df)
    out = []
    for _, m in maxima.sort_values(["order", "dtype", "stack", "mode_order"]).iterrows():
        same = timed.loc[
            (timed["shape"] == m["shape"]) & (timed["dtype"] == m["dtype"]) & (timed["stack"] == m["stack"])
            & (timed["checkpoint"] == m["checkpoint"])
        ]  # fmt: skip
        at_max = same.loc[same["batch"].astype(int) == int(m["max_batch"])]
        best = _best(same)
        out.append(
            {
                "shape": m["shape"],
                "dtype": m["dtype"],
                "stack": m["stack"],
                "checkpoint": m["checkpoint"],
                "largest batch": int(m["max_batch"]),
                "out of memory at": m["oom_batch"],
                "stopped": m["stopped"],
                "peak_mem_gb at largest": at_max["peak_mem_gb"].astype(float).max()
                if not at_max.empty
                else None,
                "tokens_per_s at largest": at_max["tokens_per_s"].astype(float).max()
                if not at_max.empty
                else None,
                "best tokens_per_s": None if best is None else float(best["tokens_per_s"]),
                "at batch": None if best is None else int(best["batch"]),
            }
        )
    return markdown_table(pd.DataFrame(out))


def _probe_table(df: pd.DataFrame) -> str:
    probes = df.loc[df["role"].isin(MEASURED) & df["status"].isin(["ok", "oom"])].copy()
    if probes.empty:
        return ""
    probes["batch"] = probes["batch"].astype(int)
    probes = probes.sort_values(["order", "dtype", "stack", "mode_order", "batch"])
    cols = ["shape", "dtype", "stack", "checkpoint", "batch", "role", "status", "step_ms", "tokens_per_s",
            "peak_mem_gb"]  # fmt: skip
    return "\n## Every step measured (out-of-memory probes included)\n\n" + markdown_table(probes, cols)


def _figures(df: pd.DataFrame, fig: Figures) -> str:
    parts = []
    for shape, dtype, stack, part in _groups(df):
        timed = _timed(part)
        if timed["batch"].nunique() < 2:
            continue
        timed = timed.assign(
            batch=timed["batch"].astype(int), tokens_per_s=timed["tokens_per_s"].astype(float)
        )
        parts.append(
            fig.line_plot(
                timed,
                x="batch",
                y="tokens_per_s",
                series="checkpoint",
                name=f"tokens_per_s_{shape}_{dtype}_{stack}",
                title=f"Tokens/s against batch, {shape}, {stack}, {dtype}",
                ylabel="tokens/s (training step)",
                logx=True,
            )
        )
    return "\n" + "\n".join(parts) if parts else ""


def render(df: pd.DataFrame, fig: Figures) -> str:
    df = _prepare(df)
    if df.empty:
        return "_no rows of this phase_\n"
    intro = (
        "Whether activation checkpointing pays: it is kept only if the larger batch it lets fit brings more "
        "tokens/s than the best batch without it, recompute included. Per shape, the best tokens/s of any "
        "checkpoint mode (block: the whole block recomputed; selective: everything but the attention call "
        "recomputed; mlp: the MLP half recomputed) against the best of `none`, at any batch measured in the "
        "same run: the shape's batch, and the batches the search for the largest one that fits tried "
        "(doubling, then bisection to within 1/8).\n\n"
    )
    errors = df.loc[df["role"].isin(MEASURED)]
    return (
        "## Does checkpointing pay?\n\n"
        + "\n".join(verdict_lines(df))
        + "\n\n"
        + intro
        + "## At the shape's batch\n\n"
        + "One training step (forward, backward, AdamW); `step_vs_none` is the recompute's cost, "
        "`memory_vs_none` the peak memory kept, both against `none` in the same run.\n\n"
        + _shape_batch_table(df)
        + "\n## The largest batch that fits\n\n"
        + _max_batch_table(df)
        + _figures(df, fig)
        + _probe_table(df)
        + failures_table(errors.loc[errors["status"] != "oom"])
    )


def headline(df: pd.DataFrame) -> list[Verdict]:
    """Per shape, dtype and stack: the best tokens/s with checkpointing over the best without, at any
    batch measured in the same run; the goal is 1 (checkpointing is kept only if it pays)."""
    df = _prepare(df)
    if df.empty:
        return []
    verdicts = []
    for shape, dtype, stack, part in _groups(df):
        timed = _timed(part)
        plain = _best(timed.loc[timed["checkpoint"] == "none"])
        ckpt = _best(timed.loc[timed["checkpoint"] != "none"])
        if ckpt is None:
            continue
        ratio = float("inf") if plain is None else ckpt["tokens_per_s"] / plain["tokens_per_s"]
        verdicts.append(
            Verdict(
                "09_checkpoint",
                f"best tokens/s with / without checkpointing, {shape}, {stack}, {dtype}",
                _label(ckpt),
                "none ran out of memory" if plain is None else _label(plain),
                float(ratio),
                1.0,
                part["gpu"].iloc[0],
                part["utc"].max(),
            )
        )
    return verdicts


REPORT = PhaseReport("09_checkpoint", TITLE, render, headline)
