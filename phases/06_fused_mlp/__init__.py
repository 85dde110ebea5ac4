"""Phase 06: the MLP silu(x W1ᵀ) W2ᵀ with a one-kernel forward (GEMM + SiLU + GEMM) in Triton."""

import common  # noqa: F401  -- first: on a machine without a GPU it selects the interpreter

from .kernel import (
    check_mlp_inputs,
    compute_dtype,
    fused_mlp,
    fused_mlp_fwd,
    fused_mlp_fwd_kernel,
    fused_mlp_in_registers,
    fused_mlp_staged,
    fused_mlp_staged_kernel,
    gemm_silu_mlp,
    mlp_hidden,
    mlp_hidden_kernel,
    pad_hidden,
    padded_cublas_mlp,
    silu_backward_kernel,
)

__all__ = [
    "check_mlp_inputs",
    "compute_dtype",
    "fused_mlp",
    "fused_mlp_fwd",
    "fused_mlp_fwd_kernel",
    "fused_mlp_in_registers",
    "fused_mlp_staged",
    "fused_mlp_staged_kernel",
    "gemm_silu_mlp",
    "mlp_hidden",
    "mlp_hidden_kernel",
    "pad_hidden",
    "padded_cublas_mlp",
    "silu_backward_kernel",
]
