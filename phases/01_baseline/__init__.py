"""Phase 01: one TransformerNP training step on PyTorch SDPA, eager and compiled -- the baseline every later phase is measured against."""
