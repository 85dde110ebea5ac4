"""reports/sparse_ffn.md: the fixed-slice dX kernel against cuBLAS, and BERT/RoBERTa with it.

The report's first line says it: the sliced backward is numerically WRONG for training."""

import pandas as pd

from common.report import Figures, PhaseReport, Verdict, best_baseline_verdict, failures_table, markdown_table

PHASE = "sparse_ffn"
GOAL_VS_SLICE = 0.95  # the goal: >= 0.95x torch.matmul on dy[:N] across N, no loss at N = all


def _kernel_table(df: pd.DataFrame) -> str:
    k = df.loc[(df["part"] == "kernel") & (df["status"] == "ok")]
    if k.empty:
        return "_no kernel rows_\n"
    wide = k.pivot_table(index=["shape", "dtype", "layer", "fraction", "n_rows"], columns="variant",
                         values="ms", aggfunc="median").reset_index()  # fmt: skip
    if {"ours", "cublas-slice"} <= set(wide.columns):
        wide["slice_ms / ours_ms"] = wide["cublas-slice"] / wide["ours"]
    if {"ours", "cublas-full"} <= set(wide.columns):
        wide["full_ms / ours_ms"] = wide["cublas-full"] / wide["ours"]
    return markdown_table(wide)


def _model_table(df: pd.DataFrame) -> str:
    m = df.loc[(df["part"] == "model") & (df["status"] == "ok")].copy()
    if m.empty:
        return "_no model rows_\n"
    keys = ["run_group", "gpu", "model", "shape", "dtype"]
    orig = m.loc[m["variant"] == "original", [*keys, "bwd_ms"]].drop_duplicates(keys)
    m = m.merge(orig.rename(columns={"bwd_ms": "_orig_bwd"}), on=keys, how="left")
    m["bwd_speedup"] = m["_orig_bwd"] / m["bwd_ms"]
    # The ideal: only the FFN dX GEMMs shrink, in proportion to N, by cuBLAS's own full-dY times.
    k = df.loc[(df["part"] == "kernel") & (df["status"] == "ok") & (df["variant"] == "cublas-full")]
    if not k.empty:
        full = k.groupby(["run_group", "gpu", "shape", "dtype"])["ms"].apply(
            lambda s: s.groupby(k.loc[s.index, "layer"]).median().sum()
        )
        m = m.join(full.rename("_ffn_dx_ms"), on=["run_group", "gpu", "shape", "dtype"])
        layers = m.get("n_layers", 12)
        saved = layers * (1 - m["fraction"]) * m["_ffn_dx_ms"]
        m["ideal_bwd_speedup"] = m["_orig_bwd"] / (m["_orig_bwd"] - saved)
    cols = ["model", "shape", "dtype", "variant", "layers", "fraction", "n_rows", "fwd_ms", "bwd_ms",
            "fwd_bwd_ms", "bwd_speedup", "ideal_bwd_speedup"]  # fmt: skip
    return markdown_table(
        m.sort_values(["model", "shape", "variant", "fraction"]), [c for c in cols if c in m]
    )


def headline(df: pd.DataFrame) -> list[Verdict]:
    """The kernel against torch.matmul on the same slice, bf16, N = all rows, at every GPU shape and
    both FFN layers (the issue: it must not lose there); goal 0.95x."""
    verdicts = []
    for shape in ("32x128", "32x512", "8x512"):
        for layer in ("intermediate", "output"):
            v = best_baseline_verdict(
                PHASE, df, cell=f"dX {layer}, {shape}, bf16, N = all",
                where={"part": "kernel", "shape": shape, "dtype": "bf16", "layer": layer, "fraction": 1.0},
                ours="ours", baselines=["cublas-slice"], goal=GOAL_VS_SLICE,
            )  # fmt: skip
            if v is not None:
                verdicts.append(v)
    return verdicts


def render(df: pd.DataFrame, fig: Figures) -> str:
    return (
        "**The sliced backward is numerically WRONG for training**: dX of the FFN layers keeps the first "
        "N rows of the flattened (batch·seq) dY only. These numbers say what such a kernel could buy, "
        "nothing about training. Inputs: random token ids and random weights (built from the config) "
        "unless a row says otherwise; timing depends on batch and sequence length only. Times are "
        "medians (ms), ratios against rows of the same run.\n\n"
        "## The kernel alone\n\n`ours` = `fixed_slice_matmul` (slice + zero rows, one launch), "
        "`cublas-slice` = `dy[:N] @ w`, `cublas-full` = `dy @ w`.\n\n"
        + _kernel_table(df)
        + "\n## In the model\n\n`bwd_ms` = forward+backward − forward; `ideal_bwd_speedup` assumes only "
        "the FFN dX GEMMs shrink, in proportion to N, from cuBLAS's full-dY times of the same run.\n\n"
        + _model_table(df)
        + failures_table(df)
    )


REPORT = PhaseReport(
    PHASE,
    "sparse_ffn — a fixed-slice FFN backward (numerically WRONG for training) in BERT/RoBERTa",
    render,
    headline,
)
