"""reports/autoselect.md: the selection table per size, its start-up cost cold and cached, what it
adds to a cold start in fresh processes, the re-timed choices (any wrong pick), the three training
runs side by side, and the issue's goals."""

import math

import pandas as pd

from common.report import Figures, PhaseReport, Verdict, failures_table, markdown_table, select_latest

PHASE = "autoselect"
TITLE = "autoselect — Triton or PyTorch per operation, chosen at run time at the model's shapes"
WAYS = ["pytorch", "triton", "autoselect"]
# The goals (H100, bf16): every pick right; autoselected >= the faster of the two (3 %
# allowed for the run-to-run spread of a mean step time) and >= 1.1x all-PyTorch where a kernel of
# ours is chosen; selection < 3 s cold and < 0.1 s cached; loss curves agree within LOSS_TOL.
SPREAD = 0.97
GOAL_VS_PYTORCH = 1.1
COLD_S, CACHED_S = 3.0, 0.1
LOSS_TOL = {"bf16": 2e-2, "fp16": 1e-2, "fp32": 1e-3}  # max relative deviation of any step's loss
COLD_START_COLUMNS = ["start_pytorch_s", "start_autoselect_s", "select_adds_s", "select_s_probe",
                      "first_step_pytorch_s", "first_step_autoselect_s", "repeats", "start_pytorch_all_s",
                      "start_autoselect_all_s"]  # fmt: skip


def _latest(df: pd.DataFrame) -> pd.DataFrame:
    """Per model size, the newest run that measured it (a size run on its own keeps the others)."""
    return select_latest(df, ["shape"])


def _num(rows: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(rows[col], errors="coerce") if col in rows else pd.Series(dtype=float)


def render(df: pd.DataFrame, fig: Figures) -> str:
    df = _latest(df)
    out = []
    for size, rows in df.groupby("shape", sort=False):
        out.append(f"## {size}\n")
        sel = rows.loc[rows["variant"].isin(["select-cold", "select-cached"])]
        if not sel.empty:
            out += ["Start-up cost of `select` (s): cold (empty cache: trial calls, compile, autotune, "
                    "timing) and cached. `compile_s`: of it, Triton compiling kernels its on-disk cache "
                    "did not hold (`kernels_compiled`; `kernels_loaded` came from that cache); `launcher_s`: "
                    "building the C launchers of new kernel signatures (`launchers_built`, rows from "
                    "2026-11-26 on): a first run's cost on a machine, which a restart does not pay. "
                    "`forward_s`: the forward that records the model's calls; each op's `select_s` "
                    "(below) the rest, where the rows have them.\n",
                    markdown_table(sel, [c for c in ["variant", "startup_s", "forward_s", "compile_s", "kernels_compiled",
                    "kernels_loaded", "launcher_s", "launchers_built", "ops_selected", "ops_triton"]
                    if c in sel])]  # fmt: skip
        cold = rows.loc[(rows["variant"] == "cold-start") & (rows["status"] == "ok")]
        if not cold.empty:
            out += ["\nWhat selection adds to a cold start (s), in fresh processes (`probe.py`): from the "
                    "end of the imports to the end of the first training step, all-PyTorch (`start_pytorch_s`) "
                    "and autoselected with an empty selection cache (`start_autoselect_s`), medians of "
                    "`repeats` rounds after one autoselect process that fills Triton's compile cache; "
                    "both pay the process's first CUDA, cuBLAS and SDPA calls. `select_s_probe`: `select` "
                    "and `apply` in those processes; `*_all_s`: every round.\n",
                    markdown_table(cold, [c for c in COLD_START_COLUMNS if c in cold])]  # fmt: skip
        ch = rows.loc[(rows["variant"] == "choice") & (rows["status"] == "ok")]
        if not ch.empty:
            cols = ["op", "shapes", "op_dtype", "pytorch_ms", "triton_ms", "speedup", "choice", "reason",
                    "select_s", "retime_pytorch_ms", "retime_triton_ms", "wrong_pick"]  # fmt: skip
            out += ["\nThe selection, and both implementations re-timed independently afterwards:\n",
                    markdown_table(ch, [c for c in cols if c in ch])]  # fmt: skip
        runs = rows.loc[rows["variant"].isin(WAYS) & (rows["status"] == "ok")]
        if not runs.empty:
            cols = ["variant", "order", "batch", "context", "mean_ms", "std_ms", "tokens_per_s", "final_loss",
                    "max_loss_rel_dev"]  # fmt: skip
            order = (
                "; `order` interleaved: the three take turns on each batch, the first way rotating; "
                "interleaved pair: PyTorch and autoselect so (the three do not fit in memory together), "
                "all-Triton alone after them; sequential: one after another"
                if "order" in runs and runs["order"].notna().any()
                else ""
            )
            out += [f"\nTraining, three ways (same weights, same batches{order}):\n",
                    markdown_table(runs, [c for c in cols if c in runs])]  # fmt: skip
            curves = []
            for _, r in runs.iterrows():
                for i, loss in enumerate(str(r.get("losses", "")).split(";")):
                    if loss:
                        curves.append({"step": i + 1, "loss": float(loss), "way": r["variant"]})
            if curves:
                out.append(fig.line_plot(pd.DataFrame(curves), x="step", y="loss", series="way",
                                         name=f"loss_{size}", title=f"loss per step, {size}"))  # fmt: skip
        out.append(failures_table(rows))
    return "\n".join(out) or "_no rows_\n"


def _verdict(cell: str, ours: str, base: str, ratio: float, goal: float, df: pd.DataFrame) -> Verdict:
    gpu = str(df["gpu"].iloc[0]) if not df.empty else ""
    utc = str(df["utc"].max()) if not df.empty else ""
    return Verdict(PHASE, cell, ours, base, ratio, goal, gpu, utc)


def headline(df: pd.DataFrame) -> list[Verdict]:
    """The issue's goals per size of the newest run; a goal without rows reads "not measured"."""
    df = _latest(df)
    nan = float("nan")
    verdicts = []
    sizes = list(dict.fromkeys(df["shape"])) if not df.empty and "shape" in df else ["seed"]
    for size in sizes:
        rows = df.loc[(df["shape"] == size) & (df["status"] == "ok")] if not df.empty else df
        ch = rows.loc[rows["variant"] == "choice"] if not rows.empty else rows
        picks = (
            ch.loc[ch["wrong_pick"].astype(str).isin(["True", "False"])]
            if "wrong_pick" in ch
            else ch.iloc[:0]
        )
        right = (picks["wrong_pick"].astype(str) == "False").mean() if not picks.empty else nan
        verdicts.append(
            _verdict(f"{size}: right picks (re-timed)", "selection", "re-timing", right, 1.0, rows)
        )
        ms = (
            {w: _num(rows.loc[rows["variant"] == w], "mean_ms").median() for w in WAYS}
            if not rows.empty
            else {}
        )
        auto, pt, tr = ms.get("autoselect", nan), ms.get("pytorch", nan), ms.get("triton", nan)
        best = (
            min(x for x in (pt, tr) if not math.isnan(x)) if not (math.isnan(pt) and math.isnan(tr)) else nan
        )
        verdicts.append(_verdict(f"{size}: autoselect vs faster of the two (spread 3%)", "autoselect",
                                 "pytorch" if best == pt else "triton", best / auto, SPREAD, rows))  # fmt: skip
        n_tri = (
            _num(rows.loc[rows["variant"] == "select-cold"], "ops_triton") if not rows.empty else pd.Series()
        )
        if not n_tri.empty and n_tri.max() > 0:
            verdicts.append(_verdict(f"{size}: autoselect vs all-PyTorch (a kernel chosen)", "autoselect",
                                     "pytorch", pt / auto, GOAL_VS_PYTORCH, rows))  # fmt: skip
        verdicts += _cold_verdicts(size, rows)
        cached = (
            _num(rows.loc[rows["variant"] == "select-cached"], "startup_s") if not rows.empty else pd.Series()
        )
        verdicts.append(_verdict(f"{size}: cached selection < {CACHED_S:g} s", "select", "budget",
                                 CACHED_S / cached.max() if not cached.empty else nan, 1.0, rows))  # fmt: skip
        dev = (
            _num(rows.loc[rows["variant"].isin(["triton", "autoselect"])], "max_loss_rel_dev")
            if not rows.empty
            else pd.Series()
        )
        dtype = str(rows["dtype"].iloc[0]) if not rows.empty else "bf16"
        tol = LOSS_TOL.get(dtype, 2e-2)
        verdicts.append(_verdict(f"{size}: loss curves agree (rel {tol:g})", "triton, autoselect", "pytorch",
                                 tol / max(dev.max(), 1e-12) if not dev.empty else nan, 1.0, rows))  # fmt: skip
    return verdicts


def _cold_verdicts(size: str, rows: pd.DataFrame) -> list[Verdict]:
    """The goal of < 3 s cold: what selection adds to a start in fresh processes, where a cold-start
    row has it; else the in-process cold selection, whole and less Triton's first compiles (it is
    also the process's first CUDA, cuBLAS and SDPA use there, which a training run pays anyway)."""
    if rows.empty:
        return [
            _verdict(f"{size}: cold selection < {COLD_S:g} s", "select", "budget", float("nan"), 1.0, rows)
        ]
    adds = _num(rows.loc[rows["variant"] == "cold-start"], "select_adds_s").dropna()
    if not adds.empty:  # a difference under 1 ms, or below zero, is the rounds' noise: 1 ms
        return [_verdict(f"{size}: selection added to a cold start < {COLD_S:g} s (fresh processes, Triton "
                         "cache warm)", "select", "budget", COLD_S / max(adds.max(), 1e-3), 1.0, rows)]  # fmt: skip
    cold = _num(rows.loc[rows["variant"] == "select-cold"], "startup_s")
    verdicts = [_verdict(f"{size}: cold selection < {COLD_S:g} s", "select", "budget",
                         COLD_S / cold.max() if not cold.empty else float("nan"), 1.0, rows)]  # fmt: skip
    compiling = _num(rows.loc[rows["variant"] == "select-cold"], "compile_s")
    if "launcher_s" in rows:  # the C launchers Triton builds beside its kernels (older rows lack it)
        launchers = _num(rows.loc[rows["variant"] == "select-cold"], "launcher_s").fillna(0.0)
        compiling = compiling.add(launchers, fill_value=0.0)
    if not compiling.empty and not cold.empty:  # the same goal with the kernels already on disk
        own = (cold - compiling).max()
        verdicts.append(_verdict(f"{size}: cold selection < {COLD_S:g} s, less Triton's first compiles",
                                 "select", "budget", COLD_S / own, 1.0, rows))  # fmt: skip
    return verdicts


REPORT = PhaseReport(PHASE, TITLE, render, headline)
