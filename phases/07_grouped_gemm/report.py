"""reports/07_grouped_gemm.md: the grouped heads against the loop, bmm and torch.compile."""

import pandas as pd

from common.report import Figures, add_speedup, failures_table, markdown_table, select_latest

KEYS = ["variant", "shape", "dtype"]
SHAPE_ORDER = {"tiny": 0, "small": 1, "mid": 2, "large": 3}


def _goal_lines(ok: pd.DataFrame) -> list[str]:
    lines = []
    for shape in ("small", "mid", "large"):
        part = ok.loc[ok["shape"] == shape].set_index("variant")["fwd_bwd_ms"]
        if not {"loop", "bmm", "compile", "grouped"} <= set(part.index):
            continue
        vs_loop = part["loop"] / part["grouped"]
        best = "bmm" if part["bmm"] <= part["compile"] else "compile"
        vs_best = part[best] / part["grouped"]
        verdict = "met" if vs_loop >= 3 and vs_best >= 1.3 else "missed"
        lines.append(
            f"- {shape}: {vs_loop:.2f}× the loop (goal 3×), {vs_best:.2f}× the best of bmm and compile "
            f"({best}; goal 1.3×): **{verdict}**"
        )
        if "grouped+nll" in part.index:
            share = (part["grouped+nll"] - part["grouped"]) / part["grouped+nll"]
            lines.append(
                f"  - the loss kernels (phase 08) add {part['grouped+nll'] - part['grouped']:.3f} ms "
                f"({share:.1%} of heads+loss): the most that fusing the loss into this epilogue could save"
            )
    return lines


def render(df: pd.DataFrame, fig: Figures) -> str:
    df = select_latest(df, KEYS)
    ok = df.loc[df["status"] == "ok"].copy()
    if ok.empty:
        return "_no successful rows_\n" + failures_table(df)
    ok = add_speedup(ok, ["shape", "dtype"], "loop", "fwd_bwd_ms")
    ok = ok.sort_values(["shape", "fwd_bwd_ms"], key=lambda s: s.map(SHAPE_ORDER) if s.name == "shape" else s)
    parts = [
        "The 10 mixture heads (512 → 1365 → 3 each, SiLU) on B·N target rows, bf16, forward+backward. "
        "TFLOP/s counts 3·2·T·13 650·515 useful FLOPs; `grouped+nll` adds phase 08's loss (its reference "
        "and gradient are the loss's). Times are medians (ms), speedups against rows of the same run.\n",
        "## Goals (forward+backward)\n",
        "\n".join(_goal_lines(ok)) or "_not measured yet_",
        "\n## All cells\n",
        markdown_table(
            ok,
            [
                "shape",
                "targets",
                "variant",
                "fwd_ms",
                "bwd_ms",
                "fwd_bwd_ms",
                "fwd_bwd_tflops",
                "speedup_vs_loop",
                "saved_mb",
                "peak_mb",
                "err_out",
                "err_grad",
            ],
        ),
        fig.line_plot(
            ok.loc[ok["variant"] != "grouped+nll"],
            x="targets",
            y="fwd_bwd_ms",
            series="variant",
            name="ms",
            title="GMM heads forward+backward, bf16",
            xlabel="target rows",
            ylabel="ms",
            logx=True,
            logy=True,
        ),
        failures_table(df),
    ]
    return "\n".join(parts)
