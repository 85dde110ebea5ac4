"""Phase 06 -- the fused MLP: y = silu(x W1ᵀ) W2ᵀ, forward in one Triton kernel.

    python -m phases.06_fused_mlp --shape small mid large      # or: just phase 06 --shape mid

At the MLP's token count of each TransformerNP shape (B·(M+N) tokens, d_model 512, d_ff 1365,
bf16) it measures, side by side in one run:
- eager: phase 01's ``mlp_eager`` (two cuBLAS GEMMs and a SiLU kernel; autograd saves a and h),
- compile: the same under ``torch.compile``,
- fused-recompute: ``fused_mlp`` as it comes: one Triton kernel forward (GEMM + SiLU + GEMM, each row
  block's hidden layer staged in L2) saving nothing; the backward recomputes a,
- fused: the same forward, the pre-activation a saved for the backward,
- fused-registers: the one-kernel forward that keeps the hidden layer in registers, saving nothing,
- gemm-silu+cublas: a Triton GEMM with a SiLU epilogue, then cuBLAS for the second GEMM,
- padded-cublas: eager's two cuBLAS GEMMs and SiLU on weights with d_ff padded to 1376.
The three Triton variants pad d_ff the same way (``pad_hidden``): 1365-long rows are not 16-byte
aligned, which keeps both cuBLAS and Triton off their fast paths.
Each row has forward, backward and forward+backward ms, model TFLOP/s (12·T·d·d_ff for
forward+backward: recomputation is not counted as useful work), memory, and the error vs an fp32
reference checked before timing. Then it re-renders reports/06_fused_mlp.md.
"""

import importlib

import torch

from common import ON_GPU

from .bench import (
    finish_sweep,
    measure_tflops_cell,
    parse_sweep_args,
    start_sweep,
    sweep_arg_parser,
    sweep_cell,
    tiles_chosen,
)
from .kernel import (
    fused_mlp,
    fused_mlp_fwd,
    fused_mlp_in_registers,
    fused_mlp_staged,
    gemm_silu_mlp,
    mlp_hidden,
    padded_cublas_mlp,
)

PHASE = "06_fused_mlp"
TRITON_VARIANTS = {
    "fused",
    "fused-recompute",
    "fused-registers",
    "gemm-silu+cublas",
}  # their rows name the tiles they ran
AUTOTUNERS = {"staged": fused_mlp_staged, "registers": fused_mlp_fwd, "hidden": mlp_hidden}
baseline = importlib.import_module("phases.01_baseline")


def variants() -> dict:
    return {
        "eager": baseline.mlp_eager,
        "compile": torch.compile(baseline.mlp_eager, dynamic=False),
        "fused": lambda x, w1, w2: fused_mlp(x, w1, w2, save_preactivation=True),
        "fused-recompute": lambda x, w1, w2: fused_mlp(x, w1, w2, save_preactivation=False),
        "fused-registers": fused_mlp_in_registers,
        "gemm-silu+cublas": gemm_silu_mlp,
        "padded-cublas": padded_cublas_mlp,
    }


def parse_args(argv=None):
    parser = sweep_arg_parser("python -m phases.06_fused_mlp", __doc__.splitlines()[0])
    return parse_sweep_args(parser, list(variants()), argv)


# The real dims on a GPU; on the CPU the interpreter gets small ones (it runs, it measures nothing).
D_MODEL, D_FF = (512, 1365) if ON_GPU else (64, 100)
DTYPE = torch.bfloat16 if ON_GPU else torch.float32


def mlp_inputs(T: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Fresh random [x, w1, w2] (requiring grad, weights scaled by 1/sqrt(fan-in)) and an output gradient."""
    device = "cuda" if ON_GPU else "cpu"
    torch.manual_seed(0)
    x = torch.randn(T, D_MODEL, device=device, dtype=DTYPE).requires_grad_()
    w1 = (torch.randn(D_FF, D_MODEL, device=device, dtype=DTYPE) / D_MODEL**0.5).requires_grad_()
    w2 = (torch.randn(D_MODEL, D_FF, device=device, dtype=DTYPE) / D_FF**0.5).requires_grad_()
    return [x, w1, w2], torch.randn(T, D_MODEL, device=device, dtype=DTYPE)


def main(argv=None) -> None:
    args = parse_args(argv)
    writer = start_sweep(PHASE)
    fns = variants()
    for shape in args.shapes:
        T = shape.tokens
        inputs, grad_out = mlp_inputs(T)
        flops = 12 * T * D_MODEL * D_FF
        print(f"{shape.label()}: {T} tokens, d_model {D_MODEL}, d_ff {D_FF}, {DTYPE}")
        for name in args.variants:
            cell = sweep_cell(name, shape.name, DTYPE, tokens=T, d_model=D_MODEL, d_ff=D_FF)
            tiles = (lambda T=T: tiles_chosen(AUTOTUNERS, T)) if name in TRITON_VARIANTS else None
            measure_tflops_cell(
                writer, cell, 18, fns[name], baseline.mlp_eager, inputs, grad_out, flops, tiles=tiles
            )
    finish_sweep(writer)


if __name__ == "__main__":
    main()
