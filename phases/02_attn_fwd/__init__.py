"""Phase 02: the rectangular attention forward in Triton, against SDPA cuDNN and SDPA flash."""
