"""Renders reports/flash2.md: the goal first, then flash-bench, the ncu profile, attention-bench,
compile-bench and the tile tuning."""

import pandas as pd

from common.ncu import render_profile
from common.report import (
    Figures,
    PhaseReport,
    add_speedup,
    best_baseline_verdict,
    failures_table,
    markdown_table,
    select_latest,
)

PHASE = "flash2"
KEYS = ["bench", "variant", "shape", "dtype", "pass", "causal"]
GOAL_SHAPE = "B=16 N=16384 D=64"
GOAL_MS = 4.3  # causal bf16 forward + backward at the goal shape, past cuDNN's 4.45-4.55 ms (issue 18)
CARD_BYTES = 79.18 * 2**30  # what CUDA reports for the H100 80GB HBM3 (quoted in its OOM messages)
FLASH_ROW = ["dtype", "head_dim", "seq", "batch", "pass"]  # one line of the flash-bench table
NAIVE_CELL = ["dtype", "batch", "head_dim", "seq"]  # one cell of attention-bench and compile-bench
SPEEDUP = "speedup_vs_sdpa_cudnn"


def _normalised(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    for col, default in (("bench", ""), ("pass", ""), ("causal", False)):
        if col not in df:
            df[col] = default
    df["causal"] = df["causal"].astype(str).str.lower().isin(["true", "1"])
    return df


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df.loc[df["status"] == "ok"]


def _reps_note(ok: pd.DataFrame) -> str:
    """How many timed calls the medians rest on (``--quick`` times on a budget instead of 100 passes)."""
    return f"Timed calls per median: {int(ok['reps'].min())}–{int(ok['reps'].max())}.\n\n"


def _goals(flash: pd.DataFrame) -> str:
    out = ["## Goals\n"]
    goal = _ok(
        flash.loc[(flash["shape"] == GOAL_SHAPE) & (flash["pass"] == "fwd+bwd") & (flash["dtype"] == "bf16")]
    )
    if goal.empty:
        out.append("_The goal shape has not been measured yet._\n")
    else:
        ms = goal.set_index("variant")["ms"]
        line = ", ".join(f"{v} {ms[v]:.2f} ms" for v in ms.index)
        ours = ms.get("triton")
        if ours is not None:
            verdict = (
                "met"
                if ours <= GOAL_MS
                else f"missed by {ours - GOAL_MS:.2f} ms ({ours / GOAL_MS:.2f}x the goal)"
            )
            cudnn = ms.get("sdpa-cudnn")
            vs = f"; {cudnn / ours:.2f}x SDPA cuDNN's speed" if cudnn else ""
            out.append(
                f"- (16, 16384, 64) causal bf16 forward+backward <= {GOAL_MS} ms: **{verdict}** -- Triton "
                f"{ours:.2f} ms{vs}. Side by side: {line}.\n"
            )
    fwd = _ok(
        flash.loc[(flash["pass"] == "fwd") & (flash["seq"] >= 4096) & flash["head_dim"].isin([64, 128])]
    )
    fwd = fwd.loc[fwd["dtype"] == "bf16"]
    if not fwd.empty:
        piv = fwd.pivot_table(
            index=["head_dim", "seq", "batch"], columns="variant", values="tflops"
        ).reset_index()
        if {"triton", "sdpa-cudnn"} <= set(piv.columns):
            piv[SPEEDUP] = piv["triton"] / piv["sdpa-cudnn"]
            worst = piv[SPEEDUP].min()
            verdict = (
                "met"
                if worst >= 1.0
                else f"missed: worst cell at {worst:.2f}x, {(1 - worst) * 100:.0f}% short"
            )
            out.append(
                f"- Forward >= 1.0x SDPA cuDNN TFLOP/s at seq >= 4096, d = 64 and 128 (bf16): **{verdict}**.\n\n"
            )
            cols = ["head_dim", "seq", "batch", "triton", "sdpa-cudnn", SPEEDUP]
            cols += [c for c in ("sdpa-flash",) if c in piv.columns]
            out.append("Forward TFLOP/s, causal bf16:\n\n" + markdown_table(piv, cols))
    out.append("\nWhat was tried and why: [phases/flash2/README.md](../phases/flash2/README.md).\n")
    return "\n".join(out) + "\n"


def _flash(flash: pd.DataFrame, fig: Figures, causal: bool) -> str:
    ok = _ok(flash)
    if ok.empty:
        return ""
    kind = "causal" if causal else "non-causal"
    out = [
        f"## flash-bench{'' if causal else ', non-causal'}: FlashAttention-2 (Triton) against naive PyTorch and SDPA\n",
        f"{kind.capitalize()}, (B, N, D) with B = 65536 // N so every length fills the GPU"
        f"{', plus the goal shape' if causal else ''}. TFLOP/s count "
        "the useful work (forward 4*B*P*D over the P attended pairs, backward 2.5x that), the same formula for every "
        "implementation. The forward is the training forward (it also writes the logsumexp). Every row passed an "
        "error check against SDPA's fp32 memory-efficient kernel first (columns err_*: max relative error). "
        f"`{SPEEDUP}` is SDPA cuDNN's time over Triton's in the same run. SDPA's cuDNN and flash kernels take "
        "no fp32, so fp32 compares with SDPA's memory-efficient kernel; fp32 Triton rows measured before "
        "the dot precision followed torch's setting ran TF32 dots (their err_* columns say so).\n",
    ]
    ok = add_speedup(ok, ["bench", "shape", "dtype", "pass", "causal"], "sdpa-cudnn", column=SPEEDUP)
    piv = ok.pivot_table(index=FLASH_ROW, columns="variant", values="ms").reset_index()
    ours = ok.loc[ok["variant"] == "triton", [*FLASH_ROW, "tflops", "err_o", "err_dq"]]
    piv = piv.merge(ours.rename(columns={"tflops": "triton TFLOP/s"}), on=FLASH_ROW)
    if "sdpa-cudnn" in piv:
        piv[SPEEDUP] = piv["sdpa-cudnn"] / piv["triton"]
    order = {"fwd": 0, "bwd": 1, "fwd+bwd": 2}
    piv = piv.sort_values(FLASH_ROW, key=lambda s: s.map(order) if s.name == "pass" else s)
    variants = [
        v for v in ("triton", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-math", "naive") if v in piv
    ]
    cols = (
        [*FLASH_ROW, *variants, "triton TFLOP/s"] + [c for c in (SPEEDUP,) if c in piv] + ["err_o", "err_dq"]
    )
    out.append(
        _reps_note(ok) + "Milliseconds per call (median), by implementation:\n\n" + markdown_table(piv, cols)
    )
    grid = ok.loc[ok["shape"] != GOAL_SHAPE]
    for (dtype, head_dim, pass_), part in grid.groupby(["dtype", "head_dim", "pass"]):
        if pass_ == "bwd" or part["seq"].nunique() < 2:
            continue
        out.append(
            fig.line_plot(
                part, x="seq", y="tflops", series="variant",
                name=f"tflops_{dtype}_d{head_dim}_{pass_}" + ("" if causal else "_noncausal"),
                title=f"{pass_}, {kind} {dtype}, d={head_dim}, B = 65536 // N: TFLOP/s against sequence length",
                xlabel="sequence length N (B = 65536 // N)", ylabel="TFLOP/s", logx=True,
            )
        )  # fmt: skip
    return "\n".join(out) + "\n"


def _oom_arithmetic(df: pd.DataFrame) -> str:
    """Work out the memory of one cell that ran out (or would have), from the shapes alone."""
    oom = df.loc[df["status"] == "oom"]
    real = oom.loc[~oom["error"].str.contains("not run")]
    if not oom.empty:
        row = (real if not real.empty else oom).sort_values("seq").iloc[0]
        how = "ran out of memory" if not real.empty else "was not run: its estimate exceeds the card"
        head = f"The cell {row['bench']} / {row['variant']} at {row['shape']} {row['dtype']} {how}"
    else:
        ok = _ok(df.loc[df["bench"] == "attention"])
        if ok.empty:
            return ""
        row = ok.sort_values(["seq", "head_dim"]).iloc[-1]
        head = f"No naive cell ran out of memory; the largest is {row['shape']} {row['dtype']}"
    batch, n, d = int(row["batch"]), int(row["seq"]), int(row["head_dim"])
    elt = 4 if row["dtype"] == "fp32" else 2
    square = batch * n * n * elt
    text = (
        f"\n**Memory of one cell.** {head}. Its score matrix alone is B x N x N x {elt} bytes = "
        f"{batch} x {n:,} x {n:,} x {elt} = {square / 1e9:.2f} GB ({square / 2**30:.2f} GiB), against "
        f"{8 * batch * n * d * elt / 1e9:.3f} GB for q, k, v, O and their gradients. The forward holds the scores "
        f"next to their scaled copy, then the softmax, which autograd keeps; the backward adds dP, dS and the "
        f"gradient of the unscaled scores: about 4 squares, {4 * square / 1e9:.1f} GB ({4 * square / 2**30:.1f} GiB), "
        f"at the peak, against the {CARD_BYTES / 2**30:.2f} GiB the card offers"
    )
    if row["status"] == "ok" and "mem_before_bwd_gb" in row and pd.notna(row["mem_before_bwd_gb"]):
        text += f" (measured: {row['peak_gb']:.1f} GB at the peak, {row['mem_before_bwd_gb']:.1f} GB before the backward)"
    elif not real.empty:
        text += f". What the allocator said: `{row['error'][:420]}`"
    n_limit = int((CARD_BYTES / (4 * batch * elt)) ** 0.5)
    text += f". By this count, at B={batch} in {row['dtype']} four squares fill the card from N of about {n_limit:,}.\n"
    return text


def _naive(df: pd.DataFrame) -> str:
    att = df.loc[df["bench"] == "attention"]
    if att.empty:
        return ""
    out = [
        "## attention-bench: naive attention (einsum, softmax, einsum)\n",
        "One head, non-causal; forward and backward timed separately (the backward re-runs on a retained graph); "
        "memory in use after the forward, before the backward; peak over the cell.\n",
    ]
    ok = _ok(att)
    if ok.empty:
        return "\n".join(out) + _oom_arithmetic(df)
    piv = ok.pivot_table(index=NAIVE_CELL, columns="pass", values="ms").reset_index()
    mem_cols = [c for c in ("mem_before_bwd_gb", "peak_gb", "mem_estimate_gb") if c in ok]
    mem = ok.groupby(NAIVE_CELL)[mem_cols].max().reset_index()
    piv = piv.merge(mem, on=NAIVE_CELL).rename(columns={"fwd": "fwd ms", "bwd": "bwd ms"})
    out.append(_reps_note(ok) + markdown_table(piv))
    out.append(_oom_arithmetic(df))
    return "\n".join(out) + "\n"


def _compile(df: pd.DataFrame) -> str:
    comp = _ok(df.loc[df["bench"] == "compile"])
    if comp.empty:
        return ""
    out = [
        "## compile-bench: torch.compile'd naive attention against eager\n",
        "Same grid; `torch.compile(naive_attention, dynamic=True)` -- one graph for every shape. The compiled "
        "output is checked against eager's on each cell (max_err_vs_eager). `speedup_vs_eager`: eager's time over "
        "the compiled function's, in the same run.\n",
    ]
    piv = comp.pivot_table(index=[*NAIVE_CELL, "pass"], columns="variant", values="ms").reset_index()
    if {"eager", "compile"} <= set(piv.columns):
        piv["speedup_vs_eager"] = piv["eager"] / piv["compile"]
    peak = comp.loc[comp["pass"] == "fwd"].pivot_table(index=NAIVE_CELL, columns="variant", values="peak_gb")
    peak.columns = [f"peak GB {c}" for c in peak.columns]
    piv = piv.merge(peak.reset_index(), on=NAIVE_CELL)
    if "max_err_vs_eager" in comp:
        err = comp.loc[comp["variant"] == "compile"].groupby(NAIVE_CELL)["max_err_vs_eager"]
        piv = piv.merge(err.max().reset_index(), on=NAIVE_CELL)
    out.append(markdown_table(piv))
    return "\n".join(out) + "\n"


def _tune(df: pd.DataFrame) -> str:
    tune = df.loc[df["bench"] == "tune"]
    if tune.empty:
        return ""
    cols = [
        c for c in ["shape", "dtype", "pass", "variant", "status", "ms", "tflops", "in_table"] if c in tune
    ]
    return (
        "## Tile tuning (`flash-bench --tune`)\n\nEach kernel's candidate tiles (m = BLOCK_M queries, n = BLOCK_N "
        "keys, w = warps, s = pipeline stages) on one shape; dq and dkdv are timed as the whole backward with "
        "the other kernel at the table's tiles; TFLOP/s of the pass they belong to. `in_table` marks the "
        "table's choice at the time of the run.\n\n"
        + markdown_table(tune.sort_values(["shape", "pass", "ms"]), cols)
    )


def render(df: pd.DataFrame, fig: Figures) -> str:
    df = select_latest(_normalised(df), KEYS)
    flash = df.loc[df["bench"] == "flash"]
    causal, non_causal = flash.loc[flash["causal"]], flash.loc[~flash["causal"]]
    profile = render_profile(PHASE, df["gpu"].iloc[0], "sdpa-cudnn")
    parts = [_goals(causal), _flash(causal, fig, True), _flash(non_causal, fig, False), profile]
    parts += [_naive(df), _compile(df), _tune(df)]
    return "\n".join(p for p in parts if p) + failures_table(df)


def headline(df: pd.DataFrame):
    """The goal shape, causal bf16 forward + backward, against the best SDPA backend; the goal is
    GOAL_MS, as a ratio: the best baseline's ms in the same run over GOAL_MS."""
    df = _normalised(df)
    where = {"bench": "flash", "shape": GOAL_SHAPE, "pass": "fwd+bwd", "dtype": "bf16", "causal": True}
    verdict = best_baseline_verdict(
        PHASE, df, cell=f"({GOAL_SHAPE}) causal bf16 fwd+bwd, goal <= {GOAL_MS} ms", where=where,
        ours="triton", baselines=["sdpa-cudnn", "sdpa-flash"], goal=None,
    )  # fmt: skip
    if verdict is None:
        return []
    rows = df.loc[(df["status"] == "ok") & (df["utc"] <= verdict.utc)]
    for col, value in where.items():
        rows = rows.loc[rows[col].astype(str) == str(value)]
    base = rows.loc[rows["variant"] == verdict.baseline].sort_values("utc")
    if not base.empty:
        verdict.goal = round(float(base["ms"].iloc[-1]) / GOAL_MS, 3)
    return [verdict]


REPORT = PhaseReport(
    PHASE,
    "flash2 — FlashAttention-2 from scratch: PyTorch and Triton, forward and backward",
    render,
    headline,
)
