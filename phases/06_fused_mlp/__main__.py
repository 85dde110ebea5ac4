"""Phase 06 -- the fused MLP: y = silu(x W1ᵀ) W2ᵀ, forward in one Triton kernel.

    python -m phases.06_fused_mlp --shape small mid large      # or: just phase 06 --shape mid

At the MLP's token count of each TransformerNP shape (B·(M+N) tokens, d_model 512, d_ff 1365,
bf16) it measures, side by side in one run:
- eager: phase 01's ``mlp_eager`` (two cuBLAS GEMMs and a SiLU kernel; autograd saves a and h),
- compile: the same under ``torch.compile``,
- fused: one Triton kernel forward (GEMM + SiLU + GEMM), the pre-activation a saved for backward,
- fused-recompute: the same forward saving nothing; the backward recomputes a,
- gemm-silu+cublas: a Triton GEMM with a SiLU epilogue, then cuBLAS for the second GEMM.
Each row has forward, backward and forward+backward ms, model TFLOP/s (12·T·d·d_ff for
forward+backward: recomputation is not counted as useful work), memory, and the error vs an fp32
reference checked before timing. Then it re-renders reports/06_fused_mlp.md.
"""

import argparse
import importlib

import torch

from common import ON_GPU, SHAPES, ResultWriter, failure_row, interpreter_banner, resolve_shape
from common.report import render_phase

from .bench import check_against, measure_fwd_bwd
from .kernel import fused_mlp, gemm_silu_mlp

PHASE = "06_fused_mlp"
baseline = importlib.import_module("phases.01_baseline")


def variants() -> dict:
    return {
        "eager": baseline.mlp_eager,
        "compile": torch.compile(baseline.mlp_eager, dynamic=False),
        "fused": fused_mlp,
        "fused-recompute": lambda x, w1, w2: fused_mlp(x, w1, w2, save_preactivation=False),
        "gemm-silu+cublas": gemm_silu_mlp,
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m phases.06_fused_mlp", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--shape",
        nargs="+",
        default=None,
        help=f"any of {', '.join(SHAPES)} (default: small mid large on a GPU, tiny on the CPU)",
    )
    parser.add_argument("--variants", nargs="+", default=None, help="a subset of the variants (default: all)")
    args = parser.parse_args(argv)
    args.shapes = [
        resolve_shape(n) for n in (args.shape or (["small", "mid", "large"] if ON_GPU else ["tiny"]))
    ]
    known = list(variants())
    args.variants = args.variants or known
    for name in args.variants:
        if name not in known:
            parser.error(f"--variants: unknown {name!r}; expected any of {', '.join(known)}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    print(interpreter_banner())
    # The real dims on a GPU; on the CPU the interpreter gets small ones (it runs, it measures nothing).
    d_model, d_ff = (512, 1365) if ON_GPU else (64, 100)
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    device = "cuda" if ON_GPU else "cpu"
    writer = ResultWriter(PHASE)
    fns = variants()
    for shape in args.shapes:
        T = shape.tokens
        torch.manual_seed(0)
        x = torch.randn(T, d_model, device=device, dtype=dtype).requires_grad_()
        w1 = (torch.randn(d_ff, d_model, device=device, dtype=dtype) / d_model**0.5).requires_grad_()
        w2 = (torch.randn(d_model, d_ff, device=device, dtype=dtype) / d_ff**0.5).requires_grad_()
        grad_out = torch.randn(T, d_model, device=device, dtype=dtype)
        flops = 12 * T * d_model * d_ff
        print(f"{shape.label()}: {T} tokens, d_model {d_model}, d_ff {d_ff}, {dtype}")
        for name in args.variants:
            cell = {
                "variant": name,
                "shape": shape.name,
                "dtype": str(dtype).removeprefix("torch."),
                "tokens": T,
                "d_model": d_model,
                "d_ff": d_ff,
            }
            try:
                errors = check_against(fns[name], baseline.mlp_eager, [x, w1, w2], grad_out)
                result = measure_fwd_bwd(fns[name], [x, w1, w2], grad_out)
            except Exception as err:  # a failed cell is a row; the sweep goes on
                row = writer.write({**cell, **failure_row(err)})
                print(f"  {name:18s} {row['status']}: {row['error'][:160]}")
                continue
            tflops = flops / (result["fwd_bwd_ms"] * 1e-3) / 1e12
            writer.write({**cell, **errors, **result, "fwd_bwd_tflops": tflops})
            print(
                f"  {name:18s} fwd {result['fwd_ms']:8.3f}  bwd {result['bwd_ms']:8.3f}  fwd+bwd "
                f"{result['fwd_bwd_ms']:8.3f} ms  {tflops:6.1f} TFLOP/s  saved {result['saved_mb']:8.1f} MB  "
                f"peak {result['peak_mb']:8.1f} MB  err {errors['err_out']:.1e}/{errors['err_grad']:.1e}"
            )
    print(f"rows: {writer.path}")
    print(f"report: {render_phase(PHASE)}")


if __name__ == "__main__":
    main()
