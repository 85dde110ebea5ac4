"""Phase 06's cells: one MLP block at the MLP's token count of each TransformerNP shape, every variant.

At B·(M+N) tokens, d_model 512, d_ff 1365 (small dims on the CPU, where the interpreter only checks
that the code runs), side by side in one run:
- eager: ``tritonlab.models.mlp_eager`` (two cuBLAS GEMMs and a SiLU kernel; autograd saves a and h),
- compile: the same under ``torch.compile``,
- fused-recompute: ``fused_mlp`` as it comes: the one-kernel forward (each row block's hidden layer
  staged in L2) saving nothing; the backward recomputes a,
- fused: the same forward, the pre-activation a saved for the backward,
- fused-registers: the one-kernel forward that keeps the hidden layer in registers,
- gemm-silu+cublas: a Triton GEMM with a SiLU epilogue, then cuBLAS for the second GEMM,
- padded-cublas: eager's two cuBLAS GEMMs and SiLU on weights with d_ff padded to 1376.
Each row: forward, backward and forward+backward ms, model TFLOP/s (12·T·d·d_ff for forward+backward:
recomputation is not counted as useful work), memory, the error vs a float32 reference (checked
before timing) and, for the Triton variants, the tiles their autotuners picked.
"""

from collections.abc import Iterator

import torch

from common import ON_GPU, Cell
from common.fwd_bwd import GEMM_HEAD_START_MS, fwd_bwd_cell
from tritonlab.mlp import fused_mlp, fused_mlp_in_registers, gemm_silu_mlp, padded_cublas_mlp
from tritonlab.models import mlp_eager, resolve_shape
from tritonlab.tuning import ConfigRecord

# The real dims on a GPU; on the CPU the interpreter gets small ones (it runs, it measures nothing).
D_MODEL, D_FF = (512, 1365) if ON_GPU else (64, 100)
TRITON_VARIANTS = ("fused", "fused-recompute", "fused-registers", "gemm-silu+cublas")
VARIANTS = (
    "eager",
    "compile",
    "fused",
    "fused-recompute",
    "fused-registers",
    "gemm-silu+cublas",
    "padded-cublas",
)


def variant_fn(name: str, record: ConfigRecord):
    """The variant's (x, w1, w2) -> y; the Triton ones note their tiles in ``record``."""
    return {
        "eager": lambda: mlp_eager,
        "compile": lambda: torch.compile(mlp_eager, dynamic=False),
        "fused": lambda: lambda x, w1, w2: fused_mlp(x, w1, w2, save_preactivation=True, record=record),
        "fused-recompute": lambda: lambda x, w1, w2: fused_mlp(x, w1, w2, record=record),
        "fused-registers": lambda: lambda x, w1, w2: fused_mlp_in_registers(x, w1, w2, record=record),
        "gemm-silu+cublas": lambda: lambda x, w1, w2: gemm_silu_mlp(x, w1, w2, record=record),
        "padded-cublas": lambda: padded_cublas_mlp,
    }[name]()


def mlp_inputs(T: int, dtype: torch.dtype) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Fresh random [x, w1, w2] (requiring grad, weights scaled by 1/sqrt(fan-in)) and an output gradient."""
    device = "cuda" if ON_GPU else "cpu"
    torch.manual_seed(0)
    x = torch.randn(T, D_MODEL, device=device, dtype=dtype).requires_grad_()
    w1 = (torch.randn(D_FF, D_MODEL, device=device, dtype=dtype) / D_MODEL**0.5).requires_grad_()
    w2 = (torch.randn(D_MODEL, D_FF, device=device, dtype=dtype) / D_FF**0.5).requires_grad_()
    return [x, w1, w2], torch.randn(T, D_MODEL, device=device, dtype=dtype)


def cells(shapes: list[str], variants: list[str], dtype: torch.dtype) -> Iterator[Cell]:
    """Each shape's inputs are built once, for all its variants, and dropped before the next shape."""
    for name in shapes:
        T = resolve_shape(name).tokens
        inputs, grad_out = mlp_inputs(T, dtype)
        for variant in variants:
            record = ConfigRecord()
            yield fwd_bwd_cell(
                variant,
                name,
                dtype,
                {"tokens": T, "d_model": D_MODEL, "d_ff": D_FF},
                variant_fn(variant, record),
                mlp_eager,
                inputs,
                grad_out,
                flops=12 * T * D_MODEL * D_FF,
                head_start_ms=GEMM_HEAD_START_MS,
                record=record if variant in TRITON_VARIANTS else None,
            )
