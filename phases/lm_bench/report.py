"""reports/lm_bench.md: the Transformer LM's step times per size, context, mode and dtype; the warm-up
study; the precision experiments; and our kernels against eager, with the issue's verdict."""

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

PHASE = "lm_bench"
TITLE = "lm_bench — a Transformer LM of five sizes timed end to end, and on our kernels"
SIZE_ORDER = {"tiny": 0, "small": 1, "medium": 2, "large": 3, "xl": 4, "2.7B": 5}
MODE_ORDER = {"forward": 0, "forward-backward": 1, "train": 2, "check": 3}
# The goals: with our kernels a full train step (bf16 autocast) >= 1.25x eager and >= 1.05x
# torch.compile, for medium and larger at context >= 512. Ours: the fastest of our variants.
GOAL = 1.25
COMPILE_GOAL = 1.05
GOAL_SIZES = ("medium", "large", "xl", "2.7B")
GOAL_CONTEXTS = (512, 1024)
EAGER = ["eager-naive", "eager-sdpa"]
COMPILED = ["compile-sdpa", "compile-ro-sdpa"]
OURS = ["ours", "ours+flce", "ours+graphs", "mixed+graphs", "mixed+shadows+graphs"]
STEP_COLUMNS = ["mean_ms", "std_ms", "first_ms", "tokens_per_s", "peak_mem_gb"]


def _part(df: pd.DataFrame, part: str) -> pd.DataFrame:
    if df.empty or "part" not in df:
        return df.iloc[:0]
    rows = df.loc[df["part"].astype(str) == part].copy()
    if "context" in rows:  # parts without a context (precision) leave NaNs that make the column float
        rows["context"] = pd.to_numeric(rows["context"], errors="coerce").astype("Int64")
    if "mode" in rows:  # rows from before the optimizer column: train steps with PyTorch's default AdamW
        default = rows["mode"].map(lambda mode: "foreach" if mode == "train" else "none")
        rows["optimizer"] = rows["optimizer"].fillna(default) if "optimizer" in rows else default
    if "size" in rows:
        rows["_order"] = rows["size"].map(SIZE_ORDER).fillna(9)
        rows["_mode"] = rows["mode"].map(MODE_ORDER).fillna(9) if "mode" in rows else 0
        keys = [c for c in ("dtype", "_order", "context", "_mode", "warmup", "variant") if c in rows]
        rows = rows.sort_values(keys, kind="stable")
    return rows


# A part's cell: the rows one run measured side by side (eager beside compile, ours beside eager).
# Per cell the newest run counts, so a part split over several runs (sizes or dtypes apart) shows
# every cell; memory's peak rows differ by head, the others by what the key names.
CELL_KEYS = ["size", "context", "mode", "dtype", "optimizer", "warmup", "head"]


def _latest_cells(rows: pd.DataFrame) -> pd.DataFrame:
    """Per cell (``CELL_KEYS`` the part has), the rows of the newest run that measured it."""
    if rows.empty:
        return rows
    return select_latest(rows, [c for c in CELL_KEYS if c in rows])


def _cols(rows: pd.DataFrame, cols: list[str]) -> list[str]:
    return [c for c in cols if c in rows]


def _ok(rows: pd.DataFrame) -> pd.DataFrame:
    return rows.loc[rows["status"] == "ok"] if "status" in rows else rows


def _timing(rows: pd.DataFrame) -> str:
    ok = rows.loc[rows["status"] == "ok"]
    out = ["## timing\n", "Mean and standard deviation over the timed steps (each between two "
           "`torch.cuda.synchronize()` calls); `first_ms` is the first timed step. OOM cells are rows too.\n"]  # fmt: skip
    cols = _cols(rows, ["size", "params", "context", "mode", "dtype", "variant", "status", *STEP_COLUMNS])
    out.append(markdown_table(rows, cols))
    if not ok.empty and set(ok["dtype"]) >= {"fp32", "bf16"}:
        wide = ok.pivot_table(index=["size", "context", "mode"], columns="dtype", values="mean_ms").dropna()
        if not wide.empty:
            wide = wide.reset_index()
            wide["_order"] = wide["size"].map(SIZE_ORDER)
            wide = wide.sort_values(["_order", "context", "mode"])
            wide["bf16 speedup"] = wide["fp32"] / wide["bf16"]
            out += ["\n### fp32 against bf16 autocast\n", markdown_table(wide, ["size", "context", "mode", "fp32",
                                                                              "bf16", "bf16 speedup"])]  # fmt: skip
    return "\n".join(out) + failures_table(rows)


def _warmup(rows: pd.DataFrame, fig: Figures) -> str:
    ok = _ok(rows).copy()
    out = [
        "## warm-up\n",
        "The same step after 0, 1, 2 and 5 untimed warm-up steps. Without warm-up the first timed step "
        "pays for one-time work -- CUDA context and cuBLAS handle creation (the run's first cell only, "
        "`process_cold`), the caching allocator growing its pool, cuBLAS picking kernels for new shapes, "
        "and for our kernels Triton's compile and autotuning -- so the mean rises and the standard "
        "deviation is dominated by that one outlier (`first_ms` against `rest_mean_ms`).\n",
    ]
    cols = _cols(rows, ["size", "context", "mode", "dtype", "warmup", "process_cold", "status",
                        "mean_ms", "std_ms", "first_ms", "rest_mean_ms"])  # fmt: skip
    out.append(markdown_table(rows, cols))
    if not ok.empty:
        ok["cell"] = ok["size"] + " ctx " + ok["context"].astype(str) + " " + ok["mode"] + " " + ok["dtype"]
        out.append(
            fig.line_plot(
                ok,
                x="warmup",
                y="std_ms",
                series="cell",
                name="warmup_std",
                title="std of step time against warm-up steps",
                xlabel="warm-up steps",
                ylabel="std (ms)",
            )  # fmt: skip
        )
    return "\n".join(out) + failures_table(rows)


def _precision(rows: pd.DataFrame) -> str:
    out = ["## precision\n"]
    # Each experiment's rows (by their shape column): what they show, and the table's columns.
    experiments = {
        "scalar": (
            "0.01 added 1000 times (exactly 10). fp16 cannot hold 0.01 exactly (it is 0.010002) and, once "
            "the sum is near 10, its spacing of 2^-7 swallows most of each add; accumulating in fp32 keeps "
            "only fp16's representation error of 0.01.\n",
            ["variant", "dtype", "value", "abs_err"],
        ),
        "toy": (
            "\nThe toy model (Linear, ReLU, LayerNorm, Linear) under bf16 autocast on the GPU: parameters "
            "stay fp32 and gradients take their dtype; linear layers compute and return bf16; "
            "LayerNorm and the cross-entropy are on CUDA autocast's float32 list.\n",
            ["tensor", "seen_dtype"],
        ),
    }
    for shape, (text, cols) in experiments.items():
        part = rows.loc[rows["shape"] == shape]
        if not part.empty:
            out += [text, markdown_table(part, _cols(part, cols))]
    return "\n".join(out)


def _ours(rows: pd.DataFrame) -> str:
    out = ["## ours\n", "Our kernels (flash2's FlashAttention-2, causal; RMSNorm, SwiGLU, RoPE, cross-entropy "
           "from `tritonlab.ops`) in the same model, against PyTorch's components with naive attention "
           "and with SDPA. Loss and gradients are checked against the PyTorch model first (`check`).\n"]  # fmt: skip
    checks = rows.loc[rows["variant"] == "check"]
    if not checks.empty:
        out.append(markdown_table(checks, _cols(checks, ["size", "context", "dtype", "status", "loss",
                                                         "loss_rel_err", "grad_rel_err", "error"])))  # fmt: skip
    timed = rows.loc[(rows["variant"] != "check") & (rows["status"] == "ok")]
    if not timed.empty:
        wide = timed.pivot_table(
            index=["size", "context", "mode", "dtype", "optimizer"], columns="variant", values="mean_ms"
        )
        wide = wide.reset_index()
        wide["_order"] = wide["size"].map(SIZE_ORDER)
        wide = wide.sort_values(["dtype", "_order", "context", "mode", "optimizer"])
        present = [v for v in EAGER if v in wide]
        compiled = [v for v in COMPILED if v in wide]
        ours = [v for v in OURS if v in wide]
        speedups = []
        for v in ours if present else []:
            speedups.append(f"{v} vs best eager")
            wide[speedups[-1]] = wide[present].min(axis=1) / wide[v]
        for v in ours if compiled else []:
            speedups.append(f"{v} vs compile")
            wide[speedups[-1]] = wide[compiled].min(axis=1) / wide[v]
        cols = ["size", "context", "mode", "dtype", "optimizer", *present, *compiled, *ours]
        out.append("\nMean step time (ms), and speedups (the baseline's time over ours). `compile-sdpa`: the "
                   "SDPA model's loss under `torch.compile` (default mode), AdamW eager; `compile-ro-sdpa`: the same "
                   "with `mode=\"reduce-overhead\"` (Inductor's CUDA graphs; `vs compile` takes the faster of "
                   "the two); `ours+flce` also fuses "
                   "the output layer into the loss; `ours+graphs` replays ours' whole train step -- forward, "
                   "backward and AdamW (`capturable=True`) -- from one CUDA graph "
                   "(`tritonlab.graphs.GraphedStep`); `mixed+graphs` is that with PyTorch's SDPA attention in place of "
                   "flash2's; `mixed+shadows+graphs` steps `tritonlab.optim.AdamW`, which also writes the bf16 "
                   "weights the forward reads (no cast). `optimizer`: every other variant of a row steps the same "
                   "AdamW, PyTorch's `foreach` "
                   "(its default) or `fused` (one pass over weights and moments; the part's default since "
                   "2026-11-26):\n\n"
                   + markdown_table(wide, [*cols, *speedups]))  # fmt: skip
    return "\n".join(out) + failures_table(rows.loc[rows["variant"] != "check"])


def _profile(rows: pd.DataFrame) -> str:
    out = ["## profile\n", "torch.profiler over the timed steps (after warm-up), naive attention unless the "
           "variant says otherwise: the top CUDA "
           "kernels by total time (`share` of all kernel time in the profile), for forward only and for a "
           "full train step (forward, backward, AdamW). Forward, backward and the optimizer step sit in NVTX "
           "ranges for Nsight Systems (`--nvtx-attention` adds scores / softmax / weighted sum).\n"]  # fmt: skip
    ok = _ok(rows)
    totals = ok.loc[ok["table"] == "total"] if "table" in ok else ok.iloc[:0]
    if not totals.empty:
        wide = totals.pivot_table(index=["size", "context", "dtype", "mode", "optimizer"], columns="variant",
                                  values="ms_per_step", sort=False).reset_index()  # fmt: skip
        out += ["\n### kernel time per step, by variant\n", "The GPU time of every kernel of one step (ms), "
                "without the host's gaps between them: what the step costs once launches are out of the way "
                "(CUDA graphs).\n", markdown_table(wide)]  # fmt: skip
    kernels = ok.loc[ok["table"] == "kernels"] if "table" in ok else ok.iloc[:0]
    for keys, group in kernels.groupby(
        ["size", "context", "dtype", "mode", "variant", "optimizer"], sort=False
    ):
        size, context, dtype, mode, variant, optimizer = keys
        adam = f", AdamW {optimizer}" if optimizer != "none" else ""
        out.append(f"\n### {variant}: {size}, context {context}, {dtype}, {mode}{adam}\n")
        cols = ["rank", "kernel", "calls", "total_ms", "ms_per_step", "share"]
        out.append(markdown_table(group, _cols(group, cols)))
        top = group.sort_values("total_ms", ascending=False).iloc[0]
        out.append(f"\nThe top kernel `{str(top['kernel'])[:80]}` takes {top['share']:.0%} of kernel time.\n")
    att = ok.loc[ok["table"] == "attention"] if "table" in ok else ok.iloc[:0]
    if not att.empty:
        out += ["\n### attention: softmax against its matmuls (forward, per step, all layers)\n",
                "Time from the profile (aten::_softmax against aten::bmm, the scores and weighted-sum "
                "matmuls); FLOPs analytic: 2·2·B·H·T²·D for the two matmuls, ~5·B·H·T² for the softmax.\n",
                markdown_table(att, _cols(att, ["size", "context", "dtype", "component", "calls", "total_ms",
                                                "flops", "tflops"]))]  # fmt: skip
        for (size, context, dtype), g in att.groupby(["size", "context", "dtype"], sort=False):
            by = g.set_index("component")
            if {"matmul", "softmax"} <= set(by.index):
                t_ratio = by.loc["softmax", "total_ms"] / by.loc["matmul", "total_ms"]
                f_ratio = by.loc["softmax", "flops"] / by.loc["matmul", "flops"]
                out.append(
                    f"- {size}, context {context}, {dtype}: the softmax takes {t_ratio:.2f}× the matmuls' "
                    f"time for {f_ratio:.3f}× their FLOPs -- it is bound by memory traffic over the T×T "
                    "scores, not by arithmetic.\n"
                )
    return "\n".join(out) + failures_table(rows)


def _memory(rows: pd.DataFrame) -> str:
    out = ["## memory\n"]
    ok = _ok(rows)
    der = ok.loc[ok["variant"] == "derivation"]
    if not der.empty:
        out += ["One residual-stream tensor (the first block's output, B×T×d_model; float32 even under bf16 "
                "autocast, since the blocks' outputs are added to the fp32 embedding) derived as "
                "B·T·d_model·bytes against the measured size of that tensor:\n",
                markdown_table(der, _cols(der, ["size", "context", "dtype", "tensor_shape", "tensor_dtype",
                                                "formula", "derived_bytes", "measured_bytes", "derived_mb",
                                                "matches"]))]  # fmt: skip
    snaps = ok.loc[ok["variant"] == "snapshot"]
    if not snaps.empty:
        out.append("\nMemory-history snapshots of one step (after a warm-up step, so AdamW's state exists); "
                   "open the pickles in https://pytorch.org/memory_viz. Active memory over the step:\n")  # fmt: skip
        out.append(markdown_table(snaps, _cols(snaps, ["size", "context", "mode", "dtype", "snapshot",
                                                       "trace_peak_gib"])))  # fmt: skip
        for _, r in snaps.iterrows():
            out.append(f"\n![{r['size']} ctx {r['context']} {r['mode']} {r['dtype']}]({r['timeline_png']})\n")
    peaks = rows.loc[rows["variant"] == "peak"]
    if not peaks.empty:
        out.append(
            "\nPeak allocated memory of one step (model, gradients, AdamW state and activations), by context:\n"
        )
        good = _ok(peaks)
        if "head" not in good.columns:
            good = good.assign(head="logits")
        good = good.assign(head=good["head"].fillna("logits"))
        if not good.empty:
            wide = good.pivot_table(
                index=["size", "context"], columns=["mode", "dtype", "head"], values="peak_mem_gb"
            )
            wide.columns = [
                f"{m} {d}{'' if h == 'logits' else ', fused head'} (GB)" for m, d, h in wide.columns
            ]
            wide = wide.reset_index()
            out.append(markdown_table(wide))
            out.append(_head_saving(good))
            good = good.loc[good["head"] == "logits"]
            for (size, mode, dtype), g in good.groupby(["size", "mode", "dtype"], sort=False):
                g = g.sort_values("context")
                if len(g) > 1:
                    lo, hi = g.iloc[0], g.iloc[-1]
                    out.append(f"- {size} {mode} {dtype}: {lo['peak_mem_gb']:.2f} GB at context {lo['context']}, "
                               f"{hi['peak_mem_gb']:.2f} GB at {hi['context']}.\n")  # fmt: skip
    return "\n".join(out) + failures_table(rows)


def _head_saving(peaks: pd.DataFrame) -> str:
    """One line per (size, mode, dtype): the memory the fused linear cross-entropy head saves against
    the output layer + loss, at the longest context measured with both."""
    lines = []
    both = peaks.pivot_table(index=["size", "mode", "dtype", "context"], columns="head", values="peak_mem_gb")
    if not {"logits", "fused"} <= set(both.columns):
        return ""
    both = both.dropna(subset=["logits", "fused"]).reset_index()
    for (size, mode, dtype), g in both.groupby(["size", "mode", "dtype"], sort=False):
        r = g.sort_values("context").iloc[-1]
        saved = r["logits"] - r["fused"]
        lines.append(
            f"- {size} {mode} {dtype}, context {r['context']}: the fused linear cross-entropy head peaks at "
            f"{r['fused']:.2f} GB against {r['logits']:.2f} GB with full logits ({saved:+.2f} GB saved).\n"
        )
    return "\n" + "".join(lines) if lines else ""


# A heading and its prose open every section: alike in shape only, as _profile's.
def _compile(rows: pd.DataFrame) -> str:
    out = ["## compile\n", "The model's loss (forward and cross-entropy) under `torch.compile` against eager, "
           "per mode; AdamW is the same eager step in both. `first_call_ms` is the first call (the compile, "
           "for `compiled`). Naive attention alone, eager against compiled: `python -m phases flash2 "
           "compile-bench`.\n"]  # fmt: skip
    ok = _ok(rows)
    if not ok.empty:
        wide = ok.pivot_table(index=["size", "context", "mode", "dtype"], columns="variant", values="mean_ms")
        wide = wide.reset_index()
        wide["_order"] = wide["size"].map(SIZE_ORDER)
        wide["_mode"] = wide["mode"].map(MODE_ORDER)
        wide = wide.sort_values(["dtype", "_order", "context", "_mode"])
        cols = ["size", "context", "mode", "dtype", *[v for v in ("eager", "compiled") if v in wide]]
        if {"eager", "compiled"} <= set(wide.columns):
            wide["compile speedup"] = wide["eager"] / wide["compiled"]
            cols.append("compile speedup")
        out += ["Mean step time (ms):\n", markdown_table(wide, cols)]
        if "compile speedup" in wide:
            for mode, g in wide.dropna(subset=["compile speedup"]).groupby("mode", sort=False):
                out.append(f"- {mode}: torch.compile gives {g['compile speedup'].min():.2f}× to "
                           f"{g['compile speedup'].max():.2f}× over eager.\n")  # fmt: skip
        out.append("\n" + markdown_table(ok, _cols(ok, ["size", "context", "mode", "dtype", "variant",
                                                         "first_call_ms", "mean_ms", "std_ms", "peak_mem_gb"])))  # fmt: skip
    return "\n".join(out) + failures_table(rows)


def render(df: pd.DataFrame, fig: Figures) -> str:
    # Each part's section, in the report's order, renders each of its cells' newest run, if any.
    sections = {
        "timing": _timing,
        "warmup": lambda rows: _warmup(rows, fig),
        "precision": _precision,
        "profile": _profile,
        "memory": _memory,
        "compile": _compile,
        "ours": _ours,
    }
    runs = {part: _latest_cells(_part(df, part)) for part in sections}
    body = "\n".join(section(runs[part]) for part, section in sections.items() if not runs[part].empty)
    return body or "_no rows of a known part_\n"


def headline(df: pd.DataFrame) -> list[Verdict]:
    """Two verdicts per goal cell (medium and larger, context 512 and 1024, a full train step in bf16):
    the fastest of our variants' mean step time against the faster eager baseline, and against the
    compiled one, of the same run; unmeasured cells say so. A GPU that ran other parts but not
    ``ours`` gets one line saying so, not a "not measured" line per goal cell."""
    ours = _part(df, "ours")
    gpu = str(df["gpu"].iloc[0]) if not df.empty and "gpu" in df else ""
    if ours.empty and not df.empty:
        cell = "train step, bf16: the ours part did not run on this GPU"
        return [Verdict(PHASE, cell, "ours", "eager and compile bf16", float("nan"), GOAL, gpu, "")]
    verdicts = []
    for size in GOAL_SIZES:
        for context in GOAL_CONTEXTS:
            for against, baselines, goal in (("eager", EAGER, GOAL), ("compile", COMPILED, COMPILE_GOAL)):
                verdicts.append(_goal_verdict(ours, size, context, against, baselines, goal, gpu))
    return verdicts


def _goal_verdict(ours: pd.DataFrame, size, context, against, baselines, goal, gpu) -> Verdict:
    """One goal cell's verdict, from the fused-AdamW rows where there are some (every variant then steps
    the optimizer a user would pick), else the foreach ones; the cell names the optimizer."""
    for optimizer in ("fused", "foreach"):
        cell = f"{size}, context {context}, train step, bf16, AdamW {optimizer}, vs {against}"
        where = {"size": size, "context": context, "mode": "train", "dtype": "bf16", "optimizer": optimizer}
        found = None if ours.empty else best_baseline_verdict(
            PHASE, ours, cell=cell, where=where, ours=OURS, baselines=baselines, goal=goal, metric="mean_ms"
        )  # fmt: skip
        if found:
            return found
    cell = f"{size}, context {context}, train step, bf16, vs {against}"
    return Verdict(PHASE, cell, "ours", f"{against} bf16", float("nan"), goal, gpu, "")


REPORT = PhaseReport(PHASE, TITLE, render, headline)
