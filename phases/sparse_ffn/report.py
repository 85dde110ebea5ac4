"""reports/sparse_ffn.md: the fixed-slice dX kernel against cuBLAS, BERT/RoBERTa with it, and where
the original model's backward spends its time.

The report's first line says it: the sliced backward is numerically WRONG for training."""

import pandas as pd

from common.report import (  # much the same list as other modules': a declaration, not logic
    Figures,
    PhaseReport,
    Verdict,
    best_baseline_verdict,
    failures_table,
    markdown_table,
    select_latest,
)

PHASE = "sparse_ffn"
GOAL_VS_SLICE = 0.95  # the goal: >= 0.95x torch.matmul on dy[:N] across N, no loss at N = all
# The headline's GEMMs: bert-base's FFN, (K, D) of the dX product per layer.
HEADLINE_KD = {"intermediate": (3072, 768), "output": (768, 3072)}


def _ok(df: pd.DataFrame, part: str) -> pd.DataFrame:
    if "part" not in df:
        return df.iloc[0:0]
    return df.loc[(df["part"] == part) & (df["status"] == "ok")]


def _kernel_table(df: pd.DataFrame) -> str:
    k = _ok(df, "kernel")
    if k.empty:
        return "_no kernel rows_\n"
    # Per cell, the newest run's variants only: ratios are taken between rows measured side by side.
    k = select_latest(k, ["shape", "dtype", "layer", "k", "d", "fraction"])
    cell = ["shape", "dtype", "layer", "k", "d", "fraction", "n_rows"]
    wide = k.pivot_table(index=cell, columns="variant", values="ms", aggfunc="median").reset_index()
    if {"ours", "cublas-slice"} <= set(wide.columns):
        wide["slice_ms / ours_ms"] = wide["cublas-slice"] / wide["ours"]
    if {"ours", "cublas-slice-zeros"} <= set(wide.columns):
        wide["slice_zeros_ms / ours_ms"] = wide["cublas-slice-zeros"] / wide["ours"]
    if {"ours", "cublas-full"} <= set(wide.columns):
        wide["full_ms / ours_ms"] = wide["cublas-full"] / wide["ours"]
    if {"ours-pointer", "cublas-slice"} <= set(wide.columns):
        wide["slice_ms / pointer_ms"] = wide["cublas-slice"] / wide["ours-pointer"]
    if "host_ms" in k:  # rows from before the host column have none
        host = k.pivot_table(index=cell, columns="variant", values="host_ms", aggfunc="median")
        for variant in ("ours", "cublas-slice"):
            if variant in host:
                wide = wide.merge(host[variant].rename(f"host_ms {variant}").reset_index(), how="left")
    return markdown_table(wide)


def _model_table(df: pd.DataFrame) -> str:
    m = _ok(df, "model")
    if m.empty:
        return "_no model rows_\n"
    m = select_latest(m, ["model", "task", "shape", "dtype", "layers"]).copy()
    keys = ["run_group", "gpu", "model", "task", "shape", "dtype"]
    graphed = "graph_bwd_ms" in m
    bwd_cols = ["bwd_ms", "graph_bwd_ms"] if graphed else ["bwd_ms"]
    orig = m.loc[m["variant"] == "original", [*keys, *bwd_cols]].drop_duplicates(keys)
    m = m.merge(orig.rename(columns={c: f"_orig_{c}" for c in bwd_cols}), on=keys, how="left")
    m["bwd_speedup"] = m["_orig_bwd_ms"] / m["bwd_ms"]
    if graphed:
        m["graph_bwd_speedup"] = m["_orig_graph_bwd_ms"] / m["graph_bwd_ms"]
    # The ideal: only the FFN dX GEMMs shrink, in proportion to N, by cuBLAS's own full-dY times.
    k = _ok(df, "kernel")
    k = k.loc[k["variant"] == "cublas-full"]
    if not k.empty:
        full = k.groupby(["run_group", "gpu", "shape", "dtype"])["ms"].apply(
            lambda s: s.groupby(k.loc[s.index, "layer"]).median().sum()
        )
        m = m.join(full.rename("_ffn_dx_ms"), on=["run_group", "gpu", "shape", "dtype"])
        saved = m["n_layers"] * (1 - m["fraction"]) * m["_ffn_dx_ms"]
        m["ideal_bwd_speedup"] = m["_orig_bwd_ms"] / (m["_orig_bwd_ms"] - saved)
        if graphed:
            m["ideal_graph_bwd_speedup"] = m["_orig_graph_bwd_ms"] / (m["_orig_graph_bwd_ms"] - saved)
    cols = ["model", "task", "shape", "dtype", "variant", "layers", "fraction", "n_rows", "fwd_ms", "bwd_ms",
            "fwd_bwd_ms", "bwd_speedup", "ideal_bwd_speedup", "graph_fwd_ms", "graph_bwd_ms",
            "graph_bwd_speedup", "ideal_graph_bwd_speedup", "graph_error"]  # fmt: skip
    return markdown_table(
        m.sort_values(["model", "task", "shape", "variant", "fraction"]), [c for c in cols if c in m]
    )


def _inputs_table(df: pd.DataFrame) -> str:
    """Which model, weights, data and tokenizer fed the model rows (and the profile)."""
    rows = df.loc[df["part"].isin(["model", "profile"])] if "part" in df else df.iloc[0:0]
    cols = [c for c in ["model", "weights", "task", "data", "tokenizer"] if c in rows]
    if rows.empty or not cols:
        return ""
    return "Inputs of the model rows:\n\n" + markdown_table(rows[cols].drop_duplicates()) + "\n"


def _profile_section(df: pd.DataFrame) -> str:
    p = _ok(df, "profile")
    if p.empty:
        return ""
    p = select_latest(p, ["model", "task", "shape", "dtype"])
    parts = ["\n## Where the original model's backward spends its time\n\n"
             "`torch.profiler` over one backward (after two warm-up steps), the top operations by self "
             "time; `share` is of all of that backward's self time of the same clock.\n"]  # fmt: skip
    for (model, shape, dtype, clock), g in p.groupby(["model", "shape", "dtype", "clock"], sort=False):
        what = (
            "CUDA kernels by CUDA time"
            if clock == "cuda"
            else "CPU operators by **CPU time** (a run without a GPU: no kernel was timed)"
        )
        parts.append(f"\n### {model}, {shape}, {dtype}: {what}\n\n")
        parts.append(markdown_table(g.sort_values("rank"), ["rank", "name", "calls", "self_ms", "share"]))
    return "".join(parts)


def headline(df: pd.DataFrame) -> list[Verdict]:
    """The kernel against torch.matmul on the same slice, bf16, at N = all rows (the issue: it must not
    lose there) and N = rows/2 (the goal holds across N), at every GPU shape and both of bert-base's
    FFN dX GEMMs; goal 0.95x."""
    if not {"k", "d"} <= set(df):
        return []
    verdicts = []
    for fraction, n in ((1.0, "all"), (0.5, "rows/2")):
        for shape in ("32x128", "32x512", "8x512"):
            for layer, (k, d) in HEADLINE_KD.items():
                # By value: k and d read back as floats where other rows leave them blank.
                rows = df.loc[(pd.to_numeric(df["k"]) == k) & (pd.to_numeric(df["d"]) == d)]
                v = best_baseline_verdict(
                    PHASE, rows, cell=f"dX {layer} ({k}->{d}), {shape}, bf16, N = {n}",
                    where={"part": "kernel", "shape": shape, "dtype": "bf16", "layer": layer, "fraction": fraction},
                    ours="ours", baselines=["cublas-slice"], goal=GOAL_VS_SLICE,
                )  # fmt: skip
                if v is not None:
                    verdicts.append(v)
    return verdicts


def render(df: pd.DataFrame, fig: Figures) -> str:
    return (
        "**The sliced backward is numerically WRONG for training**: dX of the FFN layers keeps the first "
        "N rows of the flattened (batch·seq) dY only. These numbers say what such a kernel could buy, "
        "nothing about training. Timing depends on batch and sequence length only (every batch is "
        "padded to the sequence length); the `data` column says what fed the model: a local GLUE "
        "validation split (`glue/<task> (local)`) or a generated sample with the task's GLUE columns. "
        "Times are medians (ms), ratios against rows of the same run.\n\n"
        "## The kernel alone\n\n`ours` = `fixed_slice_matmul` (slice + zero rows, one launch), "
        '`ours-pointer` = the same with `impl="pointer"` (the kernel GPUs without TMA run; `ours` takes the '
        "TMA kernel on Hopper, its short-slice kernel (deep rings, one program a tile), or its Gluon kernel over a long K where "
        "192 x 128 tiles make 0.75 to 2 waves), "
        "`cublas-slice` = `dy[:N] @ w`, `cublas-slice-zeros` = the same output as ours made by torch "
        "(`dx[N:].zero_()`, then `torch.mm(dy[:N], w, out=dx[:N])`), `cublas-full` = `dy @ w`; "
        "dY (rows, k) @ W (k, d). "
        "Each time "
        "is the GPU's: every call is queued behind a 1 ms GPU sleep, so the host's launch cost cannot "
        "leak into the interval; `host_ms` is what one call costs the CPU (rows that have it). Where "
        "`host_ms` exceeds the GPU time, a caller that does not run ahead of the GPU waits on the host.\n\n"
        + _kernel_table(df)
        + "\n## In the model\n\n`bwd_ms` = forward+backward − forward of the classification loss; "
        "`ideal_bwd_speedup` assumes only the FFN dX GEMMs shrink, in proportion to N, from cuBLAS's "
        "full-dY times of the same run. The eager model's times are mostly the host's (Python per "
        "module); the `graph_` columns are the GPU's: forward, and forward+backward, each replayed from "
        "a CUDA graph behind a 1 ms GPU sleep (`graph_error` where a model could not be captured).\n\n"
        + _inputs_table(df)
        + _model_table(df)
        + _profile_section(df)
        + failures_table(df)
    )


REPORT = PhaseReport(
    PHASE,
    "sparse_ffn — a fixed-slice FFN backward (numerically WRONG for training) in BERT/RoBERTa",
    render,
    headline,
)
