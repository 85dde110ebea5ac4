"""Training primitives in Triton: RMSNorm (alone or fused after a residual add), GELU, SwiGLU, GEGLU, RoPE, (fused linear) cross-entropy and FP8 quantisation.

Each is a function (autograd-aware, fp32 inside whatever the input dtype) and, where one is expected,
an ``nn.Module``::

    from tritonlab.ops import rms_norm, add_rms_norm, gelu, swiglu, geglu, rope, rope_cache, cross_entropy, quantize_fp8

    y = rms_norm(x, weight)                   # any leading shape, hidden <= 65536
    y = rms_norm(x)                           # no weight; rms_norm(x, w, offset=1.0): x_hat * (1 + w)
    y = rms_norm(x, weight, out_dtype=torch.bfloat16)  # y for the next bf16 matmul; dx in x's dtype
    s, y = add_rms_norm(x, branch, weight)    # s = x + branch (x's dtype), y = rms_norm(s, weight)
    y = gelu(x, approximate="tanh")           # or "none" (erf)
    y = swiglu(gate, up)                      # silu(gate) * up
    y = geglu(gate, up)                       # gelu_tanh(gate) * up
    cos, sin = rope_cache(seq_len, head_dim)  # (T, D/2) float32
    q, k = rope(q, k, cos, sin)               # (B, T, H, D), half rotation (Llama / NeoX)
    loss = cross_entropy(logits, target)      # loss in the logits' dtype, like F.cross_entropy;
    # weight=, ignore_index=, reduction=, label_smoothing=, softcap= (Gemma 2), lse_square_scale= (z-loss)
    loss = fused_linear_cross_entropy(h, lm_head.weight, target)  # linear + CE, logits never whole
    q8, scales = quantize_fp8(x, "row")       # or "block" (1 x 128 groups); e4m3 + float32 scales
    x_hat = dequantize_fp8(q8, scales, "row")
    y = linear(x, layer.weight)               # under autocast: dW out of the (cuBLAS) GEMM in float32
    q, k, v = linears(x, (wq, wk, wv))        # one x, one node: dx summed inside the GEMMs
"""

from .activations import GEGLU, GELU, SwiGLU, geglu, gelu, swiglu
from .cross_entropy import CrossEntropyLoss, cross_entropy
from .fp8 import FP8_DTYPE, FP8_MAX, dequantize_fp8, quantize_fp8
from .fused_linear_cross_entropy import FusedLinearCrossEntropyLoss, fused_linear_cross_entropy
from .linear import linear, linears
from .rms_norm import RMSNorm, add_rms_norm, rms_norm
from .rope import RotaryEmbedding, rope, rope_cache

__all__ = [
    "FP8_DTYPE",
    "FP8_MAX",
    "GEGLU",
    "GELU",
    "CrossEntropyLoss",
    "FusedLinearCrossEntropyLoss",
    "RMSNorm",
    "RotaryEmbedding",
    "SwiGLU",
    "add_rms_norm",
    "cross_entropy",
    "dequantize_fp8",
    "fused_linear_cross_entropy",
    "linear",
    "linears",
    "geglu",
    "gelu",
    "quantize_fp8",
    "rms_norm",
    "rope",
    "rope_cache",
    "swiglu",
]
