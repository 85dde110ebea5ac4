"""Phase 03: the attention backward in two passes, deterministic, against SDPA cuDNN and SDPA flash."""
