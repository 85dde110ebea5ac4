"""Phase 06: the MLP silu(x W1ᵀ) W2ᵀ with a one-kernel forward (GEMM + SiLU + GEMM) in Triton."""
