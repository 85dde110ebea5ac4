"""Attention in Triton: rectangular multi-head attention for the TransformerNP, and FlashAttention-2.

    o, lse = attention_forward(q, k, v)          # q (B, H, Lq, D) over k, v (B, H, Lk, D), no mask
    o = attention(q, k, v)                       # differentiable; deterministic two-pass backward
    o = fused_attention(q, k, v)                 # differentiable; fused backward (dQ by TMA
                                                 # reductions on Hopper; deterministic=True: none)
    o = fused_attention_kv(q, kv)                # the same, K and V packed (B, Lk, 2, H, D)
    o = fp8_attention(q, k, v)                   # e4m3 forward (Hopper), bf16 backward; fp8.py
    o = FlashAttentionTriton.apply(q, k, v, is_causal)    # q (B, Nq, D); causal or not
    o = FlashAttentionPyTorch.apply(q, k, v, is_causal)   # the same algorithm in plain PyTorch

All compute softmax(scale · q kᵀ) v with an online softmax that never stores the score matrix, and
a backward that recomputes it from the saved logsumexp: dV = Pᵀ dO, dS = P ∘ (dO Vᵀ − Δ) with
Δ = rowsum(dO ∘ O), dK = scale · dSᵀ Q, dQ = scale · dS K. bf16, fp16 and fp32 (fp32 dots are IEEE
float32 unless ``torch.set_float32_matmul_precision("high")`` allows TF32), D in 16, 32, 64, 128,
any lengths >= 1, any strides. Bad input raises a ``ValueError`` naming the argument. The public
functions take ``record=tritonlab.tuning.ConfigRecord()`` to learn the configs their launches used.

Modules: ``forward.py`` (the rectangular forward), ``backward.py`` (its two-pass backward and the
autograd function), ``fused.py`` (the fused backward), ``forward_hopper.py``, ``backward_hopper.py``
and ``fp8_hopper.py`` (the Gluon kernels Hopper runs), ``fp8.py`` (the FP8 quantisation, forward
and public functions), ``flash2.py`` (FlashAttention-2's kernels),
``flash_pytorch.py``, ``reference.py`` (float64 and naive references, FLOP counts), ``_common.py``
(what both families share: input checks, the online-softmax tile update, the backward's
preprocess Δ, tuning keys and the shared-memory fit of every config space).

Why two kernel families remain: the rectangular kernels (``forward.py``, ``backward.py``,
``fused.py``) take the model's 4-D (B, H, L, D) strided views with no mask and are autotuned and
launched directly from a per-signature cache; FlashAttention-2's (``flash2.py``) take 3-D inputs
with a causal mask, skip the tiles above the diagonal, split the rest into unmasked and masked
ranges per tile and run causal programs heaviest first, with a measured tile table. Their hot
loops differ in exactly those masks and bounds; merging them would add branches or arguments to
both loops, which nothing here measured as free, so the two families share the tile update, the
preprocess, the checks and the config pruning, and keep their own loops.
"""

from ._common import HEAD_DIMS
from .backward import attention
from .flash2 import FlashAttentionTriton, TileConfig
from .flash_pytorch import FlashAttentionPyTorch
from .forward import IMPLS, attention_forward
from .fp8 import fp8_attention, fp8_attention_forward, supports_fp8
from .fused import fused_attention, fused_attention_kv
from .reference import attention_flops, causal_mask, naive_attention, reference_attention

__all__ = [
    "HEAD_DIMS",
    "IMPLS",
    "FlashAttentionPyTorch",
    "FlashAttentionTriton",
    "TileConfig",
    "attention",
    "attention_flops",
    "attention_forward",
    "causal_mask",
    "fp8_attention",
    "fp8_attention_forward",
    "fused_attention",
    "fused_attention_kv",
    "naive_attention",
    "reference_attention",
    "supports_fp8",
]
