"""Phase flash2: FlashAttention-2 from scratch, in PyTorch and in Triton, against naive attention and SDPA."""
