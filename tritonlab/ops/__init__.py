"""Training primitives in Triton: RMSNorm, GELU, SwiGLU, RoPE, cross-entropy and FP8 quantisation.

Each is a function (autograd-aware, fp32 inside whatever the input dtype) and, where one is expected,
an ``nn.Module``::

    from tritonlab.ops import rms_norm, gelu, swiglu, rope, rope_cache, cross_entropy, quantize_fp8

    y = rms_norm(x, weight)                   # any leading shape, hidden <= 65536
    y = gelu(x, approximate="tanh")           # or "none" (erf)
    y = swiglu(gate, up)                      # silu(gate) * up
    cos, sin = rope_cache(seq_len, head_dim)  # (T, D/2) float32
    q, k = rope(q, k, cos, sin)               # (B, T, H, D), half rotation (Llama / NeoX)
    loss = cross_entropy(logits, target)      # float32 loss; ignore_index, reduction, inplace=
    q8, scales = quantize_fp8(x, "row")       # or "block" (1 x 128 groups); e4m3 + float32 scales
    x_hat = dequantize_fp8(q8, scales, "row")
"""

from .activations import GELU, SwiGLU, gelu, swiglu
from .cross_entropy import CrossEntropyLoss, cross_entropy
from .fp8 import FP8_DTYPE, FP8_MAX, dequantize_fp8, quantize_fp8
from .rms_norm import RMSNorm, rms_norm
from .rope import RotaryEmbedding, rope, rope_cache

__all__ = [
    "FP8_DTYPE",
    "FP8_MAX",
    "GELU",
    "CrossEntropyLoss",
    "RMSNorm",
    "RotaryEmbedding",
    "SwiGLU",
    "cross_entropy",
    "dequantize_fp8",
    "gelu",
    "quantize_fp8",
    "rms_norm",
    "rope",
    "rope_cache",
    "swiglu",
]
