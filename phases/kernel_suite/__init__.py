"""Phase kernel_suite: tritonlab.ops (RMSNorm, GELU, SwiGLU, RoPE, cross-entropy, FP8) against eager, torch.compile and Liger-Kernel."""
