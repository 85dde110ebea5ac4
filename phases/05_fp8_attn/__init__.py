"""Phase 05: FP8 (e4m3) attention for Hopper, against our bf16 attention, SDPA cuDNN and SDPA flash."""
