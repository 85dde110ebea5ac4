"""reports/06_fused_mlp.md: the fused MLP against eager and torch.compile, per shape."""

import pandas as pd

from common.report import Figures, add_speedup, failures_table, markdown_table, select_latest

KEYS = ["variant", "shape", "dtype"]
SHAPE_ORDER = {"tiny": 0, "small": 1, "mid": 2, "large": 3}
TRITON = ["fused", "fused-recompute", "gemm-silu+cublas"]


def _goal_lines(ok: pd.DataFrame) -> list[str]:
    lines = []
    for shape in ("mid", "large"):
        part = ok.loc[ok["shape"] == shape].set_index("variant")
        if not {"eager", "compile", "fused"} <= set(part.index):
            continue
        for name in [v for v in TRITON if v in part.index]:
            vs_eager, vs_compile = part.loc[name, "speedup_vs_eager"], part.loc[name, "speedup_vs_compile"]
            verdict = "met" if vs_eager >= 1.2 and vs_compile >= 1.0 else "missed"
            lines.append(
                f"- {shape}, {name}: {vs_eager:.2f}× eager (goal 1.2×), {vs_compile:.2f}× compile "
                f"(goal 1.0×): **{verdict}**"
            )
    return lines


def render(df: pd.DataFrame, fig: Figures) -> str:
    df = select_latest(df, KEYS)
    ok = df.loc[df["status"] == "ok"].copy()
    if ok.empty:
        return "_no successful rows_\n" + failures_table(df)
    ok = add_speedup(ok, ["shape", "dtype"], "eager", "fwd_bwd_ms")
    ok = add_speedup(ok, ["shape", "dtype"], "compile", "fwd_bwd_ms")
    ok = ok.sort_values(["shape", "fwd_bwd_ms"], key=lambda s: s.map(SHAPE_ORDER) if s.name == "shape" else s)
    parts = [
        "One MLP block, y = silu(x W1ᵀ) W2ᵀ with d_model 512, d_ff 1365, at the MLP's token count of each "
        "shape (B·(M+N)), bf16, forward+backward through autograd. Times are medians (ms); TFLOP/s counts "
        "12·T·512·1365 useful FLOPs (a recomputed GEMM is not useful work); speedups are against rows of "
        "the same run. `saved_mb` is what the forward keeps for the backward (including its output); "
        "`peak_mb` the peak above the inputs during forward+backward.\n",
        "## Goals (forward+backward, mid and large)\n",
        "\n".join(_goal_lines(ok)) or "_not measured yet_",
        "\n## All cells\n",
        markdown_table(
            ok,
            [
                "shape",
                "tokens",
                "variant",
                "fwd_ms",
                "bwd_ms",
                "fwd_bwd_ms",
                "fwd_bwd_tflops",
                "speedup_vs_eager",
                "speedup_vs_compile",
                "saved_mb",
                "peak_mb",
                "err_out",
                "err_grad",
            ],
        ),
        fig.line_plot(
            ok,
            x="tokens",
            y="fwd_bwd_tflops",
            series="variant",
            name="tflops",
            title="MLP forward+backward, bf16",
            xlabel="tokens",
            ylabel="TFLOP/s",
            logx=True,
        ),
        failures_table(df),
    ]
    return "\n".join(parts)
