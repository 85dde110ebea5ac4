"""reports/kernel_suite.md: the verdicts, the final table, the goals, per-kernel tables and plots."""

import pandas as pd

from common.report import (
    Figures,
    PhaseReport,
    Verdict,
    best_baseline_verdict,
    failures_table,
    markdown_table,
    select_verdict_runs,
)

from .names import CE_OPTION_SETS, KERNELS

BASELINES = ("eager", "compile", "liger")
# Ours without the target check (cross-entropy's check_targets=False): not a baseline, a measure of the check.
UNCHECKED = "ours-unchecked"
MEMORY_BOUND = ("rms_norm", "gelu", "swiglu", "geglu", "rope", "fp8_row", "fp8_block")
COPY_GOAL_PCT = 90.0
# Medians of the same cell move by about 1-2% between runs on this machine: closer than that is a tie.
TIE = 1.02
CE_GOAL_MS, CE_GOAL_SHAPE = 3.5, "16384x128256"
# The headline goal (README): at its largest size each op is at least as fast as the fastest of
# eager, torch.compile and Liger-Kernel measured in the same run.
HEADLINE_GOAL = 1.0
# The fused linear cross-entropy (issue 25): at most 1.05x torch.compile's time with at most 2 GiB
# beyond the inputs -- compile's speed at a fraction of its memory.
FLCE_TIME_GOAL, FLCE_MEMORY_GOAL_GIB = 1.05, 2.0
HEADLINE_GOALS = {"fused_linear_cross_entropy": 1 / FLCE_TIME_GOAL}
# Cross-entropy's options (all on, or each alone: names.CE_OPTION_SETS) cost at most 5% over the plain loss.
OPTIONS_COST_GOAL = 1.05
TITLE = "kernel_suite — Triton RMSNorm, GELU, SwiGLU, RoPE, cross-entropy and FP8 quantisation"


def _main_pass(kernel: str) -> str:
    return "fwd" if kernel.startswith("fp8") else "fwd+bwd"


def _elements(shape: str) -> int:
    tokens, width = shape.split("x")
    return int(tokens) * int(width)


def _largest_shape(rows: pd.DataFrame) -> str | None:
    """The largest shape we measured among ``rows`` (None if ours has none)."""
    ours = rows.loc[rows["variant"] == "ours", "shape"]
    return max(ours, key=_elements) if not ours.empty else None


def _ours_and_others(cell: pd.DataFrame) -> tuple[pd.Series | None, pd.DataFrame]:
    """One (kernel, shape, pass) cell split into our row (None if missing) and the timed baselines."""
    ours = cell.loc[cell["variant"] == "ours"]
    others = cell.loc[cell["variant"].isin(BASELINES)].dropna(subset=["ms"])
    return (ours.iloc[0] if not ours.empty else None), others


def _fastest(others: pd.DataFrame) -> pd.Series:
    return others.loc[others["ms"].idxmin()]


def _kernel_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per (shape, pass): each variant's ms, ours' GB/s and share of copy, the best alternative."""
    lines = []
    for (shape, pass_), cell in rows.groupby(["shape", "pass"], sort=False):
        by_variant = cell.set_index("variant")
        line = {"shape": shape, "pass": pass_}
        for variant in ("ours", UNCHECKED, *BASELINES):
            line[f"{variant} ms"] = by_variant["ms"].get(variant, float("nan"))
        ours, others = _ours_and_others(cell)
        mine = ours if ours is not None else pd.Series(dtype=float)
        for column, key in (("ours GB/s", "gbps"), ("ours % copy", "pct_copy"), ("copy GB/s", "copy_gbps")):
            line[column] = mine.get(key, float("nan"))
        if ours is not None and not others.empty:
            best = _fastest(others)
            line["best other"] = best["variant"]
            line["speedup_vs_best"] = best["ms"] / ours["ms"]
            if "device_ms" in others:
                line["others' min device ms"] = others["device_ms"].min()
        for column, key in (
            ("ours host ms", "host_ms"),
            ("ours device ms", "device_ms"),
            ("ours extra GB", "extra_mem_gb"),
            ("ours rel err", "rel_err"),
        ):
            line[column] = mine.get(key, float("nan"))
        lines.append(line)
    table = pd.DataFrame(lines)
    if table[f"{UNCHECKED} ms"].isna().all():  # only the losses with a target check have it
        table = table.drop(columns=f"{UNCHECKED} ms")
    table["_elems"] = table["shape"].map(_elements)
    order = {"fwd": 0, "bwd": 1, "fwd+bwd": 2}
    table["_pass"] = table["pass"].map(order)
    return table.sort_values(["_elems", "_pass"]).drop(columns=["_elems", "_pass"])


def _plot(kernel: str, rows: pd.DataFrame, fig: Figures) -> str:
    main = rows.loc[rows["pass"] == _main_pass(kernel)].copy()
    if main.empty:
        return ""
    main["elements"] = main["shape"].map(_elements)
    copy = main.loc[main["variant"] == "ours"].assign(
        variant="device copy (clone)", gbps=lambda d: d["copy_gbps"]
    )
    data = pd.concat([main, copy], ignore_index=True)
    return fig.line_plot(
        data,
        x="elements",
        y="gbps",
        series="variant",
        name=kernel,
        logx=True,
        title=f"{kernel} {_main_pass(kernel)}, {'/'.join(sorted(main['dtype'].unique()))}, "
        f"tokens x width {min(main['shape'], key=_elements)} to {max(main['shape'], key=_elements)}: GB/s",
        xlabel="tokens x width",
        ylabel="GB/s",
    )


def _goals(ok: pd.DataFrame, every_run: pd.DataFrame) -> str:
    """``ok``: one run per cell (the verdicts'); ``every_run``: every ok row, for same-run ratios."""
    lines = [
        "| kernel | shape | pass | ours % of copy | goal >= 90% | slower than the best alternative (by > 2%)? |",
        "|---|---|---|---|---|---|",
    ]
    for kernel in MEMORY_BOUND:
        rows = ok.loc[ok["kernel"] == kernel]
        largest = _largest_shape(rows)
        if largest is None:
            continue
        for _, row in rows.loc[(rows["variant"] == "ours") & (rows["shape"] == largest)].iterrows():
            met = (
                "met"
                if row["pct_copy"] >= COPY_GOAL_PCT
                else f"missed by {COPY_GOAL_PCT - row['pct_copy']:.1f} points"
            )
            lines.append(f"| {kernel} | {largest} | {row['pass']} | {row['pct_copy']:.1f}% | {met} | |")
        slower = []
        for (shape, pass_), cell in rows.groupby(["shape", "pass"]):
            ours, others = _ours_and_others(cell)
            if ours is None or others.empty:
                continue
            best = _fastest(others)
            if best["ms"] * TIE < ours["ms"]:
                why = (
                    f" (ours host-bound: {ours['host_ms']:.3f} ms of CPU per call, {ours['device_ms']:.3f} ms "
                    "of kernels)"
                    if _host_bound(ours)
                    else ""
                )
                slower.append(
                    f"{shape} {pass_}: {best['variant']} {ours['ms'] / best['ms']:.2f}x faster{why}"
                )
        lines.append(f"| {kernel} | all | all | | | {'; '.join(slower) if slower else 'never'} |")
    ce = ok.loc[
        (ok["kernel"] == "cross_entropy") & (ok["shape"] == CE_GOAL_SHAPE) & (ok["variant"] == "ours")
    ]
    text = "\n".join(lines) + "\n"
    if not ce.empty:
        row = ce.iloc[0]
        grad_gb = _elements(CE_GOAL_SHAPE) * 2 / 1e9
        verdict = "met" if row["ms"] <= CE_GOAL_MS else f"missed by {row['ms'] - CE_GOAL_MS:.2f} ms"
        # the per-row fp32 losses and a few scalars come on top of the gradient: allow 0.1%
        memory = "met" if row["extra_mem_gb"] <= grad_gb * 1.001 else "missed"
        text += (
            f"\nCross-entropy forward+backward at {CE_GOAL_SHAPE} bf16: **{row['ms']:.2f} ms** against the "
            f"{CE_GOAL_MS} ms goal ({verdict}; {row.get('device_ms', float('nan')):.2f} ms of it in kernels); "
            f"memory beyond the logits {row['extra_mem_gb']:.3f} GB against {grad_gb:.3f} GB for their gradient "
            f"({memory}).\n"
        )
    return text + _options_goal(every_run) + _check_cost(ok) + _flce_goals(ok)


def _check_cost(ok: pd.DataFrame) -> str:
    """Per cross-entropy cell: ours against ours without the target check, from the same run."""
    lines = []
    mine = ok.loc[ok["variant"].isin(["ours", UNCHECKED])]
    for (kernel, shape, _), cell in mine.groupby(["kernel", "shape", "pass"]):
        by_variant = cell.set_index("variant")
        if set(by_variant.index) != {"ours", UNCHECKED}:  # (render's rows: one run per cell)
            continue
        checked, unchecked = by_variant.loc["ours"], by_variant.loc[UNCHECKED]
        lines.append(
            f"- {kernel} {shape}: {checked['ms']:.3f} ms checked, {unchecked['ms']:.3f} ms unchecked "
            f"({checked['ms'] / unchecked['ms']:.2f}x)"
        )
    if not lines:
        return ""
    return (
        "\nWhat the target check costs (ours with `check_targets=True`, the default, against `False`; "
        "one run per line):\n\n" + "\n".join(lines) + "\n"
    )


def _host_bound(row: pd.Series) -> bool:
    """A cell whose call costs the CPU over 10% more than its kernels cost the GPU (False where
    unmeasured); within 10% the GPU is busy (5.289 ms a call for 5.272 ms of kernels is not)."""
    return row.get("host_ms", float("nan")) > 1.1 * row.get("device_ms", float("nan"))


def _options_goal(every_run: pd.DataFrame) -> str:
    """Per options cell and shape, ours with the options against our plain loss, from the newest run
    that timed the two (not the per-cell verdict runs, which may differ between the two cells)."""
    ours = every_run.loc[every_run["variant"] == "ours"]
    plain = ours.loc[ours["kernel"] == "cross_entropy"]
    lines = []
    for kernel, options in CE_OPTION_SETS.items():
        cells = ours.loc[ours["kernel"] == kernel]
        what = ", ".join(f"{name} {value:g}" for name, value in options.items())
        for shape in sorted(cells["shape"].unique(), key=_elements):
            with_opts = cells.loc[cells["shape"] == shape].set_index("run_group")
            base = plain.loc[plain["shape"] == shape].set_index("run_group")
            shared = [g for g in with_opts.index.unique() if g in base.index]
            if not shared:
                lines.append(f"- {what}, {shape}: the plain loss was never timed in its run; no ratio")
                continue
            group = max(shared, key=lambda g: with_opts.loc[[g], "utc"].max())
            row, plain_row = with_opts.loc[[group]].iloc[-1], base.loc[[group]].iloc[-1]
            calls = f"{row['ms']:.3f} ms against {plain_row['ms']:.3f} ms plain"
            if _host_bound(row) or _host_bound(plain_row):
                # Both calls run the same Python and wait for the host: their times are its speed of the
                # moment, not the options'. What the options add is on the GPU: judged there.
                cost = row["device_ms"] / plain_row["device_ms"]
                verdict = "met" if cost <= OPTIONS_COST_GOAL else "missed"
                lines.append(
                    f"- {what}, {shape}: host-bound (calls {calls}, {row['ms'] / plain_row['ms']:.2f}x); "
                    f"judged on the kernels: {row['device_ms']:.3f} against {plain_row['device_ms']:.3f} ms, "
                    f"{cost:.3f}x ({verdict}; run {group})"
                )
                continue
            cost = row["ms"] / plain_row["ms"]
            verdict = "met" if cost <= OPTIONS_COST_GOAL else "missed"
            lines.append(f"- {what}, {shape}: {calls}, {cost:.3f}x ({verdict}; run {group})")
    if not lines:
        return ""
    return (
        "\nCross-entropy with its options (all on, then each alone), against the plain loss in the same "
        f"run (goal: at most {OPTIONS_COST_GOAL}x). Where a call costs the CPU more than its kernels cost the "
        "GPU, the two calls' times are the host's and move by more than the goal from one cell to the "
        "next; such a pair is judged on its kernels' time (profiler sums):\n\n" + "\n".join(lines) + "\n"
    )


def _gib(gb: float) -> float:
    """The rows' GB (10**9 bytes) in GiB, the unit of the memory goal."""
    return gb * 1e9 / 2**30


def _flce_goals(ok: pd.DataFrame) -> str:
    rows = ok.loc[ok["kernel"] == "fused_linear_cross_entropy"]
    lines = []
    for shape in sorted(rows["shape"].unique(), key=_elements):
        cell = rows.loc[rows["shape"] == shape].set_index("variant")
        if "ours" not in cell.index or "compile" not in cell.index:
            continue
        ours, compile_ = cell.loc["ours"], cell.loc["compile"]
        time = ours["ms"] / compile_["ms"]
        gib = _gib(ours["extra_mem_gb"])
        time_ok = "met" if time <= FLCE_TIME_GOAL else "missed"
        memory_ok = "met" if gib <= FLCE_MEMORY_GOAL_GIB else "missed"
        liger = ""
        if "liger" in cell.index:
            row = cell.loc["liger"]
            liger = f"; Liger {row['ms']:.2f} ms, {_gib(row['extra_mem_gb']):.2f} GiB"
        rounds = ours.get("rounds", float("nan"))
        order = (
            f"{int(rounds)} alternating rounds" if pd.notna(rounds) else "variants timed one after another"
        )
        lines.append(
            f"- {shape}: ours {ours['ms']:.2f} ms, {time:.3f}x compile's "
            f"{compile_['ms']:.2f} ms ({time_ok}), {gib:.2f} GiB beyond the inputs ({memory_ok}) against "
            f"compile's {_gib(compile_['extra_mem_gb']):.2f} GiB{liger} ({order})"
        )
    if not lines:
        return ""
    return (
        f"\nFused linear cross-entropy forward+backward, bf16: goal at most {FLCE_TIME_GOAL}x "
        f"`torch.compile`'s time and {FLCE_MEMORY_GOAL_GIB} GiB beyond the inputs, both at once. The "
        "variants are timed in alternating rounds (ours, eager, compile, Liger, then back): their GEMMs hold "
        "the GPU at its power limit, where the clock follows the load before it and the order alone moves "
        "the ratio by ~5% (phases/kernel_suite/README.md).\n\n" + "\n".join(lines) + "\n"
    )


def _final_table(ok: pd.DataFrame) -> str:
    lines = []
    for kernel in KERNELS:
        rows = ok.loc[(ok["kernel"] == kernel) & (ok["pass"] == _main_pass(kernel))]
        shape = _largest_shape(rows)
        if shape is None:
            continue
        mine, others = _ours_and_others(rows.loc[rows["shape"] == shape])
        line = {"kernel": f"{kernel} {_main_pass(kernel)} {shape}", "our latency (ms)": mine["ms"]}
        if not others.empty:
            best = _fastest(others)
            line.update(
                {
                    "base latency (ms)": best["ms"],
                    "base": best["variant"],
                    "speedup_vs_best": best["ms"] / mine["ms"],
                    "metric": "GB/s",
                    "our perf": mine["gbps"],
                    "base perf": best["gbps"],
                }
            )
        lines.append(line)
    return markdown_table(pd.DataFrame(lines))


def render(df: pd.DataFrame, fig: Figures) -> str:
    every_run = df.loc[df["status"] == "ok"]
    df = select_verdict_runs(df, ["kernel", "shape", "dtype", "pass"], ours=["ours", UNCHECKED])
    ok = df.loc[df["status"] == "ok"]
    parts = [
        "Each kernel against PyTorch eager, `torch.compile` of the same eager code and Liger-Kernel, bf16, "
        "every cell checked against the eager function on fp32 inputs before it is timed (`rel err`). "
        "GB/s counts each input read once and each output written once; `% copy` compares it with a "
        "`clone()` moving as many bytes, measured in the same run. `extra GB` is the memory a forward+backward "
        "allocates beyond its inputs. `speedup_vs_best` is the best alternative's time over ours (> 1: ours is faster). "
        "`host ms` is the CPU time of one call (Python, autograd, launches; measured without waiting for the GPU), "
        "`device ms` the sum of its kernels' durations (profiler): where host > device, the cell measures "
        "launch overhead, not kernels.\n",
        "\n## Final table\n\nAt each kernel's largest measured shape; the base is the fastest of eager, "
        "compile and Liger there.\n\n",
        _final_table(ok),
        "\n## Goals\n\n",
        _goals(ok, every_run),
        "\nWhy each miss happens, measured: the notes in "
        "[phases/kernel_suite/README.md](../phases/kernel_suite/README.md#tried-and-dropped).\n",
    ]
    for kernel in KERNELS:
        rows = ok.loc[ok["kernel"] == kernel]
        if rows.empty:
            continue
        parts += [f"\n## {kernel}\n\n", markdown_table(_kernel_table(rows)), "\n", _plot(kernel, rows, fig)]
    parts.append(failures_table(df))
    return "".join(parts)


def headline(df: pd.DataFrame) -> list[Verdict]:
    """Per op, at its largest size in its main pass (bf16 where measured): ours against the fastest
    of eager, compile and Liger in the same run."""
    ok = df.loc[df["status"] == "ok"] if "status" in df else df
    if ok.empty or "kernel" not in ok:
        return []
    verdicts = []
    for kernel in KERNELS:
        rows = ok.loc[(ok["kernel"] == kernel) & (ok["pass"] == _main_pass(kernel))]
        if rows.empty:
            continue
        dtypes = list(rows["dtype"].unique())
        dtype = "bf16" if "bf16" in dtypes else dtypes[0]
        rows = rows.loc[rows["dtype"] == dtype]
        shape = _largest_shape(rows)
        if shape is None:
            continue
        verdict = best_baseline_verdict(
            "kernel_suite",
            rows,
            cell=f"{kernel} {_main_pass(kernel)} {shape} {dtype}",
            where={"shape": shape},
            ours="ours",
            baselines=list(BASELINES),
            goal=HEADLINE_GOALS.get(kernel, HEADLINE_GOAL),
        )
        if verdict is not None:
            verdicts.append(verdict)
    return verdicts


REPORT = PhaseReport("kernel_suite", TITLE, render, headline)
