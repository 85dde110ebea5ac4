"""Phase 07: the 10 GMM head MLPs as one grouped Triton kernel (stacked first layer, block-diagonal second)."""
