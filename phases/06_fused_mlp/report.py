"""reports/06_fused_mlp.md: the fused MLP against eager and torch.compile, per shape."""

import pandas as pd

from common.fwd_bwd import dtype_names, fwd_bwd_verdicts, render_sweep
from common.ncu import render_profile
from common.report import Figures, PhaseReport, Verdict

PHASE = "06_fused_mlp"
# Ours: the Triton variants, and eager's cuBLAS GEMMs on padded weights (no Triton: what padding buys).
OURS = ["fused", "fused-recompute", "fused-registers", "gemm-silu+cublas", "padded-cublas"]
GOAL_VS_EAGER, GOAL_VS_COMPILE = 1.2, 1.0


def _goal_lines(ok: pd.DataFrame) -> list[str]:
    lines = []
    for (shape, dtype), part in ok.groupby(["shape", "dtype"], sort=False):
        if shape not in ("mid", "large"):
            continue
        part = part.set_index("variant")
        if not {"eager", "compile"} <= set(part.index):
            continue
        for name in [v for v in OURS if v in part.index]:
            vs_eager, vs_compile = part.loc[name, "speedup_vs_eager"], part.loc[name, "speedup_vs_compile"]
            verdict = "met" if vs_eager >= GOAL_VS_EAGER and vs_compile >= GOAL_VS_COMPILE else "missed"
            lines.append(
                f"- {shape} ({dtype}), {name}: {vs_eager:.2f}× eager (goal {GOAL_VS_EAGER}×), "
                f"{vs_compile:.2f}× compile (goal {GOAL_VS_COMPILE}×): **{verdict}**"
            )
    return lines


def headline(df: pd.DataFrame) -> list[Verdict]:
    """``fused_mlp`` (the recompute variant) forward+backward against the best of eager and compile,
    bf16 at mid and large; goal 1.0× (the README's: at least compile's speed)."""
    cells = [
        (df, shape, f"{shape}, bf16, fwd+bwd", ["eager", "compile"], GOAL_VS_COMPILE)
        for shape in ("mid", "large")
    ]
    return fwd_bwd_verdicts(PHASE, "fused-recompute", cells)


def render(df: pd.DataFrame, fig: Figures) -> str:
    dtypes = dtype_names(df)
    # render_sweep's arguments, with this phase's values: 06-08's calls share their shape, not their content.
    sweep = render_sweep(
        df,
        fig,
        size="tokens",
        throughput="fwd_bwd_tflops",
        baselines=["eager", "compile"],
        sort_by=["shape", "fwd_bwd_ms"],
        intro="One MLP block, y = silu(x W1ᵀ) W2ᵀ with d_model 512, d_ff 1365, at the MLP's token count of "
        f"each shape (B·(M+N)), {dtypes}, forward+backward through autograd. Times are medians (ms); "
        "TFLOP/s counts 12·T·512·1365 useful FLOPs (a recomputed GEMM is not useful work); speedups are "
        "against rows of the same run. `saved_mb` is what the forward keeps for the backward (including "
        "its output); `peak_mb` the peak above the inputs during forward+backward.\n",
        goals_over="forward+backward, mid and large",
        goal_lines=_goal_lines,
        plot={
            "y": "fwd_bwd_tflops",
            "name": "tflops",
            "title": f"MLP forward+backward, {dtypes}, every shape",
            "ylabel": "TFLOP/s",
        },
    )
    return sweep + render_profile(PHASE, df["gpu"].iloc[0])


REPORT = PhaseReport(PHASE, "06 · Fused MLP: GEMM + SiLU + GEMM in one forward kernel", render, headline)
