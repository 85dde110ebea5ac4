"""Phase kernel_suite: Triton RMSNorm, GELU, SwiGLU, RoPE, cross-entropy and FP8 quantisation."""

import common  # noqa: F401  -- first: it decides interpreter mode before any kernel is defined

from .activations import GELU, GELUFunction, SwiGLU, SwiGLUFunction, gelu, swiglu
from .cross_entropy import CrossEntropyFunction, CrossEntropyLoss, cross_entropy
from .fp8 import FP8_DTYPE, FP8_MAX, dequantize_fp8, quantize_fp8
from .rms_norm import RMSNorm, RMSNormFunction, rms_norm
from .rope import RoPEFunction, RotaryEmbedding, rope, rope_cache

__all__ = [
    "FP8_DTYPE",
    "FP8_MAX",
    "GELU",
    "CrossEntropyFunction",
    "CrossEntropyLoss",
    "GELUFunction",
    "RMSNorm",
    "RMSNormFunction",
    "RoPEFunction",
    "RotaryEmbedding",
    "SwiGLU",
    "SwiGLUFunction",
    "cross_entropy",
    "dequantize_fp8",
    "gelu",
    "quantize_fp8",
    "rms_norm",
    "rope",
    "rope_cache",
    "swiglu",
]
