"""Phase 08: the GMM negative log-likelihood, one Triton kernel forward and one backward."""
