"""Phase flash2: FlashAttention-2 from scratch, in PyTorch and in Triton, forward and backward."""

from .flash_pytorch import FlashAttentionPyTorch
from .flash_triton import HEAD_DIMS, FlashAttentionTriton, TileConfig, flash_backward, flash_forward
from .reference import attention_flops, causal_mask, check_inputs, naive_attention, reference_attention

__all__ = [
    "HEAD_DIMS",
    "FlashAttentionPyTorch",
    "FlashAttentionTriton",
    "TileConfig",
    "attention_flops",
    "causal_mask",
    "check_inputs",
    "flash_backward",
    "flash_forward",
    "naive_attention",
    "reference_attention",
]
