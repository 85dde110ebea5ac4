"""reports/07_grouped_gemm.md: the grouped heads against the loop, bmm and torch.compile."""

import pandas as pd

from common.fwd_bwd import dtype_names, fwd_bwd_verdicts, render_sweep
from common.report import Figures, PhaseReport, Verdict

PHASE = "07_grouped_gemm"
GOAL_VS_LOOP, GOAL_VS_BEST = 3.0, 1.3  # the README's goals: ≥ 3× the loop, ≥ 1.3× the best of bmm and compile


def _goal_lines(ok: pd.DataFrame) -> list[str]:
    lines = []
    for (shape, _), part in ok.groupby(["shape", "dtype"], sort=False):
        ms = part.set_index("variant")["fwd_bwd_ms"]
        if not {"loop", "bmm", "compile", "grouped"} <= set(ms.index):
            continue
        best = "bmm" if ms["bmm"] <= ms["compile"] else "compile"
        for ours in [v for v in ("grouped", "grouped-save") if v in ms.index]:
            vs_loop, vs_best = ms["loop"] / ms[ours], ms[best] / ms[ours]
            verdict = "met" if vs_loop >= GOAL_VS_LOOP and vs_best >= GOAL_VS_BEST else "missed"
            lines.append(
                f"- {shape}, {ours}: {vs_loop:.2f}× the loop (goal {GOAL_VS_LOOP:g}×), {vs_best:.2f}× the best "
                f"of bmm and compile ({best}; goal {GOAL_VS_BEST:g}×): **{verdict}**"
            )
        if "grouped+nll" in ms.index:
            share = (ms["grouped+nll"] - ms["grouped"]) / ms["grouped+nll"]
            lines.append(
                f"  - the loss kernels (tritonlab.gmm) add {ms['grouped+nll'] - ms['grouped']:.3f} ms "
                f"({share:.1%} of heads+loss): the most that fusing the loss into this epilogue could save"
            )
    return lines


def headline(df: pd.DataFrame) -> list[Verdict]:
    """``gmm_heads`` (grouped) forward+backward against the best of the loop, bmm and compile, bf16
    at every shape; goal 1.3× (the README's goal against the best of bmm and compile)."""
    baselines = ["loop", "bmm", "compile"]
    cells = [
        (df, shape, f"{shape}, bf16, fwd+bwd", baselines, GOAL_VS_BEST) for shape in ("small", "mid", "large")
    ]
    return fwd_bwd_verdicts(PHASE, "grouped", cells)


def render(df: pd.DataFrame, fig: Figures) -> str:
    dtypes = dtype_names(df)
    # render_sweep's arguments, with this phase's values: 06-08's calls share their shape, not their content.
    return render_sweep(
        df,
        fig,
        size="targets",
        throughput="fwd_bwd_tflops",
        baselines=["loop"],
        sort_by=["shape", "fwd_bwd_ms"],
        intro=f"The 10 mixture heads (512 → 1365 → 3 each, SiLU) on B·N target rows, {dtypes}, "
        "forward+backward. TFLOP/s counts 3·2·T·13 650·515 useful FLOPs; `grouped+nll` adds the loss "
        "kernels of `tritonlab.gmm` (its reference and gradient are the loss's). Times are medians (ms), "
        "speedups against rows of the same run.\n",
        goal_lines=_goal_lines,
        plot={
            "y": "fwd_bwd_ms",
            "name": "ms",
            "title": f"GMM heads forward+backward, {dtypes}, every shape",
            "xlabel": "target rows",
            "ylabel": "ms",
        },
        unplotted=("grouped+nll",),
    )


REPORT = PhaseReport(PHASE, "07 · Grouped GEMM for the 10 GMM heads", render, headline)
