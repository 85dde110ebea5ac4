"""Phase 10: the TransformerNP's whole training step captured in one CUDA graph and replayed, against the plain eager step -- step time, tokens/s, peak memory, checked equal first."""
