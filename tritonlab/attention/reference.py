"""What the kernels are checked against: attention written out in PyTorch, and its FLOP count.

- ``reference_attention``: o and the natural-log logsumexp in float64 (differentiable: autograd
  through it gives reference gradients), any leading dimensions, causal or not;
- ``naive_attention``: einsum, softmax, einsum in the inputs' dtype, materialising the whole score
  matrix -- the baseline whose memory grows with the square of the sequence length;
- ``causal_mask``: True where query i may attend to key j (i >= j, top-left aligned, as SDPA's
  ``is_causal``);
- ``attention_flops``: the useful work, FlashAttention's convention.
"""

import math

import torch


def causal_mask(n_queries: int, n_keys: int, device=None) -> torch.Tensor:
    """(Nq, Nk) booleans, True where query i may attend to key j (i >= j)."""
    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril()


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None, *, is_causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse) in float64 for q (..., Lq, D) over k, v (..., Lk, D): softmax(scale · q kᵀ) v and the
    logsumexp of the scaled scores (scale 1/sqrt(D) unless given)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if is_causal:
        s = s.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse[..., None]) @ v.double(), lse


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(d)) v with einsum, materialising the whole (Nq, Nk) score matrix.

    ``mask`` (broadcastable to the scores) is True where a key is kept.
    """
    scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("...qk,...kd->...qd", torch.softmax(scores, dim=-1), v)


def attended_pairs(n_queries: int, n_keys: int, is_causal: bool) -> int:
    """How many (query, key) pairs attention really computes: all of them, or i >= j."""
    if not is_causal:
        return n_queries * n_keys
    # Query i sees min(i + 1, Nk) keys.
    full = max(n_queries - n_keys, 0) * n_keys
    ramp = min(n_queries, n_keys)
    return full + ramp * (ramp + 1) // 2


def attention_flops(
    batch: int, n_queries: int, n_keys: int, head_dim: int, is_causal: bool, pass_: str
) -> float:
    """FLOPs of the useful work: forward = two matmuls over the attended pairs (4·B·P·D, B counting
    every head); backward = 2.5x forward (five matmuls, not counting recomputation)."""
    forward = 4.0 * batch * attended_pairs(n_queries, n_keys, is_causal) * head_dim
    return {"fwd": forward, "bwd": 2.5 * forward, "fwd+bwd": 3.5 * forward}[pass_]


__all__ = ["attended_pairs", "attention_flops", "causal_mask", "naive_attention", "reference_attention"]
