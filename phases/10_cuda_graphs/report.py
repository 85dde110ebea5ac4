"""reports/10_cuda_graphs.md: per shape and components, the graphed step's speedup over the plain step
of the same run, then every step measured with its validation against the plain step."""

import pandas as pd

from common.report import Figures, PhaseReport, Verdict, failures_table, ok_table, select_latest

TITLE = "10_cuda_graphs — the whole training step in one CUDA graph against the plain eager step"
SHAPE_ORDER = {"tiny": 0, "small": 1, "mid": 2, "large": 3}
# Small is the shape with the least GPU work per launch, where a graph can gain most (the H100
# measures 1.02-1.03x there). At mid and large the GPU's work dominates even more.
GOALS = {"small": 1.2}
TABLE = ["shape", "batch", "dtype", "components", "graph", "step_ms", "step_p20_ms", "step_p80_ms", "tokens_per_s",
         "peak_mem_gb", "speedup_vs_plain", "validation", "max_param_diff", "loss_max_diff",
         "update_rel_diff"]  # fmt: skip


def _prepare(df: pd.DataFrame) -> pd.DataFrame:
    """This phase's rows of the newest run group per shape, dtype and components (side by side)."""
    if df.empty or "graph" not in df or "components" not in df:
        return pd.DataFrame()
    df = df.loc[df["graph"].astype(str).isin(["plain", "graphed"])].copy()
    if df.empty:
        return df
    keep = select_latest(df, ["shape", "dtype", "components"])
    return keep.assign(order=keep["shape"].map(SHAPE_ORDER).fillna(9))


def _pair(part: pd.DataFrame) -> tuple[pd.Series | None, pd.Series | None]:
    ok = part.loc[part["status"] == "ok"]
    plain = ok.loc[ok["graph"] == "plain"]
    graphed = ok.loc[ok["graph"] == "graphed"]
    return (plain.iloc[-1] if not plain.empty else None, graphed.iloc[-1] if not graphed.empty else None)


def _groups(df: pd.DataFrame):
    for (_, shape, dtype, components), part in df.groupby(
        ["order", "shape", "dtype", "components"], sort=True
    ):
        yield shape, dtype, components, part


def verdict_lines(df: pd.DataFrame) -> list[str]:
    lines = []
    for shape, dtype, components, part in _groups(df):
        plain, graphed = _pair(part)
        head = f"- **{shape}** ({components}, {dtype}): "
        if plain is None:
            lines.append(head + "the plain step did not run; no verdict.")
            continue
        if graphed is None:
            failed = part.loc[(part["graph"] == "graphed") & (part["status"] != "ok")]
            why = f" ({failed['status'].iloc[-1]}: {failed['error'].iloc[-1]})" if not failed.empty else ""
            lines.append(head + f"the graphed step did not run{why}; no verdict.")
            continue
        ratio = float(plain["step_ms"]) / float(graphed["step_ms"])
        goal = GOALS.get(shape)
        if goal is None:
            judged = "faster" if ratio > 1 else "not faster"
            verdict = f"**the graph is {judged}**"
        else:
            verdict = "**the graph pays**" if ratio >= goal else f"**the graph misses its {goal:g}× goal**"
        lines.append(
            head
            + f"{verdict}: {float(graphed['step_ms']):.4g} ms a step against {float(plain['step_ms']):.4g} ms "
            f"plain, {ratio:.2f}×; {float(graphed['tokens_per_s']):,.0f} tokens/s. Validation over "
            f"{int(graphed['check_steps'])} steps: {graphed['validation']} (max |Δθ| "
            f"{float(graphed['max_param_diff']):.3g})."
        )
    return lines


def render(df: pd.DataFrame, fig: Figures) -> str:
    df = _prepare(df)
    if df.empty:
        return "_no rows of this phase_\n"
    return (
        "## Does the graph pay?\n\n"
        + "\n".join(verdict_lines(df))
        + "\n\nOne training step (forward, backward, fused AdamW) of the TransformerNP: plain (eager, every "
        "kernel launched by the host) against the same step captured once in a CUDA graph and replayed "
        "(`tritonlab.graphs.GraphedStep`), measured side by side in one run. Goal: ≥ 1.2× at small, the shape "
        "with the least GPU work per launch.\n\n"
        "## Every step measured\n\n"
        "Step times are medians with p20/p80 over the timed steps; `peak_mem_gb` is the memory the variant "
        "added at its peak (model, AdamW state, activations; the graph's pool). `validation`: the graphed "
        "step against the plain one from the same weights and batch — `bitwise`, or within tolerance where "
        "the plain step is not bitwise reproducible itself; the plain row's differences are its own "
        "run-to-run ones.\n\n"
        + ok_table(
            df,
            TABLE,
            sort_by=["order", "dtype", "components", "graph"],
            ascending=[True, True, True, False],
            none="_no step measured_\n",
        )
        + failures_table(df)
    )


def headline(df: pd.DataFrame) -> list[Verdict]:
    """Per shape, dtype and components: plain step time / graphed step time in the same run."""
    df = _prepare(df)
    verdicts = []
    if df.empty:
        return verdicts
    for shape, dtype, components, part in _groups(df):
        plain, graphed = _pair(part)
        if plain is None or graphed is None:
            continue
        verdicts.append(
            Verdict(
                "10_cuda_graphs",
                f"graphed / plain training step, {shape}, {components}, {dtype}",
                f"graphed+{components}",
                f"plain+{components}",
                float(plain["step_ms"]) / float(graphed["step_ms"]),
                GOALS.get(shape),
                part["gpu"].iloc[0],
                part["utc"].max(),
            )
        )
    return verdicts


REPORT = PhaseReport("10_cuda_graphs", TITLE, render, headline)
