"""Phase 04: the attention backward fused into one launch, against phase 03's kernels and SDPA."""
