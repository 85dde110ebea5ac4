"""reports/07_grouped_gemm.md: the grouped heads against the loop, bmm and torch.compile."""

import importlib

import pandas as pd

from common.report import Figures

render_sweep = importlib.import_module("phases.06_fused_mlp.report").render_sweep


def _goal_lines(ok: pd.DataFrame) -> list[str]:
    lines = []
    for shape in ("small", "mid", "large"):
        part = ok.loc[ok["shape"] == shape].set_index("variant")["fwd_bwd_ms"]
        if not {"loop", "bmm", "compile", "grouped"} <= set(part.index):
            continue
        best = "bmm" if part["bmm"] <= part["compile"] else "compile"
        for ours in [v for v in ("grouped", "grouped-save") if v in part.index]:
            vs_loop, vs_best = part["loop"] / part[ours], part[best] / part[ours]
            verdict = "met" if vs_loop >= 3 and vs_best >= 1.3 else "missed"
            lines.append(
                f"- {shape}, {ours}: {vs_loop:.2f}× the loop (goal 3×), {vs_best:.2f}× the best of bmm "
                f"and compile ({best}; goal 1.3×): **{verdict}**"
            )
        if "grouped+nll" in part.index:
            share = (part["grouped+nll"] - part["grouped"]) / part["grouped+nll"]
            lines.append(
                f"  - the loss kernels (phase 08) add {part['grouped+nll'] - part['grouped']:.3f} ms "
                f"({share:.1%} of heads+loss): the most that fusing the loss into this epilogue could save"
            )
    return lines


def render(df: pd.DataFrame, fig: Figures) -> str:
    return render_sweep(
        df,
        fig,
        size="targets",
        throughput="fwd_bwd_tflops",
        baselines=["loop"],
        sort_by=["shape", "fwd_bwd_ms"],
        intro="The 10 mixture heads (512 → 1365 → 3 each, SiLU) on B·N target rows, bf16, forward+backward. "
        "TFLOP/s counts 3·2·T·13 650·515 useful FLOPs; `grouped+nll` adds phase 08's loss (its reference "
        "and gradient are the loss's). Times are medians (ms), speedups against rows of the same run.\n",
        goal_lines=_goal_lines,
        plot={
            "y": "fwd_bwd_ms",
            "name": "ms",
            "title": "GMM heads forward+backward, bf16",
            "xlabel": "target rows",
            "ylabel": "ms",
            "logy": True,
        },
        unplotted=("grouped+nll",),
    )
