"""reports/11_autotune.md: per function and shape, the table's pick against fresh full tunes and the
untuned default, the spread of the fresh tunes' picks, the first training step with and without the
table, and the sm_80 compile check behind the A100 table."""

import pandas as pd

from common.report import PhaseReport, Verdict, failures_table, markdown_table, select_latest

from .tables import SM80_RESULTS, load_sm80, sm80_usable

PHASE = "11_autotune"
TITLE = "11_autotune — tuned configs per GPU and dtype, kept in tables, looked up instead of tuning"
SHAPE_ORDER = {"tiny": 0, "small": 1, "mid": 2, "large": 3}
# The table's pick within 2% of a fresh full tune: ms_full / ms_table >= 1 / 1.02.
TABLE_GOAL = 1 / 1.02
# The first step with the table within 2x a steady step: steady / first >= 0.5.
STARTUP_GOAL = 0.5
COMPARE = ["function", "shape", "ms_table", "ms_full", "ms_full_min", "ms_full_max", "ms_off", "table_vs_full",
           "off_vs_full", "first_s_table", "first_s_full", "repeats", "distinct_full_picks"]  # fmt: skip
# Rows before the compile-cache split have first_step_s_table (the cache as the run found it) only.
STARTUP = ["shape", "first_step_s_table_cold", "first_step_s_table_warm", "first_step_s_table", "first_step_s_full",
           "steady_ms", "steady_ms_full", "first_vs_steady_table_cold", "first_vs_steady_table_warm",
           "first_vs_steady_table", "first_vs_steady_full", "compile_s_table_cold", "compile_s_table_warm",
           "compile_s_full", "kernels_compiled_table_cold", "kernels_loaded_table_warm", "first_step_s_sdpa",
           "steady_ms_sdpa", "first_vs_steady_sdpa", "build_s_table_warm", "build_s_sdpa"]  # fmt: skip
STARTUP_CASES = {  # first-step column -> how the headline cell names it
    "first_step_s_table_warm": "compiled kernels on disk",
    "first_step_s_table_cold": "compiling every kernel",
    "first_step_s_table": "compile cache as found",
}
TUNE = ["function", "shape", "tune_s", "kernels_tuned"]
KERNEL = ["function", "shape", "kernel", "key", "table_vs_best", "off_vs_best", "best_ms", "distinct_picks",
          "pick_table", "picks_full"]  # fmt: skip


def _latest(df: pd.DataFrame, variant: str, keys: list[str]) -> pd.DataFrame:
    part = df.loc[(df["variant"] == variant) & (df["status"] == "ok")]
    if part.empty:
        return part
    part = select_latest(part, keys)
    return part.assign(order=part["shape"].map(SHAPE_ORDER).fillna(9)).sort_values(["order", *keys[1:]])


def headline(df: pd.DataFrame) -> list[Verdict]:
    verdicts = []
    # The goal's "side by side": inside each fresh tune every candidate is timed in one process, the
    # table's pick among them; per function and shape its worst kernel (median over the tunes). The
    # workload's time across fresh processes stays in the body: host-bound calls move it by tens of %.
    kernels = _latest(df, "kernel", ["shape", "function", "kernel"])
    for (shape, function), group in kernels.groupby(["shape", "function"], sort=False):
        worst = group.loc[group["table_vs_best"].idxmax()]
        verdicts.append(Verdict(
            PHASE, f"{function} @ {shape}: table pick vs each fresh tune's best, side by side (worst kernel: "
            f"{worst['kernel']})", "table", "fresh tune's best", 1.0 / float(worst["table_vs_best"]),
            TABLE_GOAL, worst["gpu"], worst["utc"],
        ))  # fmt: skip
    for _, row in _latest(df, "startup", ["shape"]).iterrows():
        for column, case in STARTUP_CASES.items():
            if pd.notna(row.get(column)):
                verdicts.append(Verdict(
                    PHASE, f"TransformerNP @ {row['shape']}: first step with the table ({case}), in steady "
                    "steps (inverse)", "first step", "steady step",
                    float(row["steady_ms"]) / (1e3 * float(row[column])), STARTUP_GOAL, row["gpu"], row["utc"],
                ))  # fmt: skip
    return verdicts


def sm80_section() -> str:
    """The committed sm_80 compile results: per kernel, configs compiled and usable on an A100."""
    results = load_sm80(SM80_RESULTS)
    if results is None:
        return "_no sm_80 compile results committed_\n"
    rows = pd.DataFrame(results["rows"])
    usable = sm80_usable(results)
    rows["usable_at_key"] = [
        (k, key, c) in usable for k, key, c in zip(rows["kernel"], rows["key"], rows["config"], strict=True)
    ]
    per_kernel = rows.groupby("kernel").agg(
        compiled=("config", lambda s: len(set(s))),
        keys=("key", lambda s: len(set(s))),
    )
    spills = rows.loc[rows["spill_stores"].fillna(1) > 0]
    per_kernel["spilling_configs"] = spills.groupby("kernel")["config"].nunique()
    per_kernel["usable_configs"] = rows.loc[rows["usable_at_key"]].groupby("kernel")["config"].nunique()
    per_kernel = per_kernel.fillna(0).reset_index()
    bad = rows.loc[~rows["usable"]].drop_duplicates(["kernel", "config"])
    return (
        f"Every config of each kernel's search space an sm_80 GPU can run, compiled for {results['target']} "
        f"with Triton {results['triton']} at the TransformerNP's shapes (bf16, D = 64); usable: compiles, "
        f"spills nothing, at most {results['shared_limit_bytes']} B of shared memory. Not timed: no A100 is "
        f"lent here.\n\n"
        + markdown_table(per_kernel)
        + "\n\nConfigs that are not usable (spill bytes stored/loaded, shared memory):\n\n"
        + markdown_table(
            bad, ["kernel", "config", "registers", "spill_stores", "spill_loads", "shared_bytes", "error"]
        )
    )


def render(df: pd.DataFrame, fig) -> str:
    parts = []
    compare = _latest(df, "compare", ["shape", "function"])
    if not compare.empty:
        parts += [
            "## The table's pick against fresh full tunes and the untuned default\n\n"
            "Each time is the workload (forward and, where tuned, backward) in its own fresh process; "
            "`table_vs_full` is the table's time over the fresh tunes' median (goal ≤ 1.02), "
            "`distinct_full_picks` how many different pick sets the fresh tunes made.\n",
            markdown_table(compare, COMPARE),
            "\n### Picks\n",
            markdown_table(compare, ["function", "shape", "picks_table", "picks_full"]),
        ]
    kernels = _latest(df, "kernel", ["shape", "function", "kernel"])
    if not kernels.empty:
        parts += [
            "\n## Per kernel, inside each fresh tune\n\n"
            "Every fresh tune times all candidates side by side in one process: `table_vs_best` is the "
            "table's pick against that tune's best, `off_vs_best` the untuned default's (medians over the "
            "fresh tunes; goal for the table ≤ 1.02); `distinct_picks` counts the configs the fresh tunes "
            "picked.\n",
            markdown_table(kernels, KERNEL),
        ]
    startup = _latest(df, "startup", ["shape"])
    if not startup.empty:
        parts += [
            "\n## The first training step, with and without the table\n\n"
            "The TransformerNP with our kernels (two-pass attention, staged MLP, grouped heads, GMM loss), "
            "bf16 autocast, each in a fresh process (goal with the table: the first step ≤ 2 steady steps). "
            "`table_cold`: the table, every kernel compiled from an empty Triton cache; `table_warm`: the "
            "table again on that cache (a restart); `full`: a full tune from an empty cache, what the "
            "first run costs without the table. Compiling is not tuning: the table removes only the "
            "second; `compile_s_*` is the first step's Triton compiling. `*_sdpa`: the same model on "
            "PyTorch's components with SDPA cuDNN, a fresh process too -- the first step the baseline's "
            "users pay (cuBLAS handles, lazily loaded kernels, the autograd engine's threads); "
            "`tritonlab.models.build` starts `tritonlab.preload()`, so Triton's own once-per-process "
            "start-up -- and, in rows with `build_s_*`, PyTorch's first bf16 linear, RMSNorm "
            "and backward at a tiny shape -- overlap the model's construction (older rows: without them; "
            "the oldest without any preload). `build_s_*`: building the model, its optimizer and the "
            "batch before that first step, the time the preload has (build + first step is what the "
            "user waits). Older rows have `first_step_s_table` only, with the cache as the run found it.\n",
            markdown_table(startup, [c for c in STARTUP if c in startup]),
        ]
        if "first_step_profile_table_warm" in startup:
            for _, row in startup.dropna(subset=["first_step_profile_table_warm"]).iterrows():
                top = str(row["first_step_profile_table_warm"]).split("; ")
                parts.append(
                    f"\nWhere a restart's first step goes at {row['shape']} (another fresh process on the "
                    "warm cache, under cProfile, which slows it: the shares, not the seconds):\n\n"
                    + "".join(f"- `{entry}`\n" for entry in top)
                )
                own = row.get("first_step_profile_own_table_warm")
                if isinstance(own, str) and own:
                    parts.append(
                        "\nThe same profile by each function's own time:\n\n"
                        + "".join(f"- `{entry}`\n" for entry in own.split("; "))
                    )
    tune = _latest(df, "tune", ["shape", "function"])
    if not tune.empty:
        parts += ["\n## Tuning runs that wrote the tables\n", markdown_table(tune, [*TUNE, "picks"])]
    parts += ["\n## The A100: the sm_80 compile check\n\n", sm80_section()]
    return "\n".join(parts) + failures_table(df)


REPORT = PhaseReport(PHASE, TITLE, render, headline)
