"""What every FlashAttention version must agree with: input checks, naive attention, FLOP counts.

Shapes follow the course this phase reproduces: q is (B, Nq, D), k and v are (B, Nk, D), with no
head dimension (fold heads into the batch). Causal masking keeps key j for query i when i >= j,
aligned at the top-left corner, as ``torch.nn.functional.scaled_dot_product_attention`` does.
"""

import math

import torch


def check_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    dtypes: tuple[torch.dtype, ...],
    head_dims: tuple[int, ...] | None = None,
    device_type: str | None = None,
) -> None:
    """Raise a ValueError naming the argument when q, k, v are not a valid (B, N, D) triple."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(
                f"{name}: expected a 3-D tensor (batch, seq, head_dim), got shape {tuple(t.shape)}"
                " (fold the heads into the batch dimension)"
            )
        if t.dtype not in dtypes:
            raise ValueError(f"{name}: dtype {t.dtype} is not supported; expected one of {dtypes}")
        if t.dtype != q.dtype:
            raise ValueError(f"{name}: dtype {t.dtype} differs from q's {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: on {t.device}, but q is on {q.device}")
        if t.shape[1] == 0:
            raise ValueError(f"{name}: sequence length must be at least 1, got shape {tuple(t.shape)}")
    if device_type is not None and q.device.type != device_type:
        raise ValueError(f"q: expected a tensor on {device_type}, got {q.device}")
    if k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]:
        raise ValueError(f"k, v: batch sizes {k.shape[0]}, {v.shape[0]} differ from q's {q.shape[0]}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"v: sequence length {v.shape[1]} differs from k's {k.shape[1]}")
    if k.shape[2] != q.shape[2] or v.shape[2] != q.shape[2]:
        raise ValueError(f"k, v: head dims {k.shape[2]}, {v.shape[2]} differ from q's {q.shape[2]}")
    if head_dims is not None and q.shape[2] not in head_dims:
        raise ValueError(f"q: head dim {q.shape[2]} is not supported; expected one of {head_dims}")


def causal_mask(n_queries: int, n_keys: int, device=None) -> torch.Tensor:
    """(Nq, Nk) booleans, True where query i may attend to key j (i >= j)."""
    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril()


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v with einsum, materialising the whole (Nq, Nk) score matrix.

    ``mask`` (broadcastable to the scores) is True where a key is kept. This is the reference the
    benchmarks run, and the one whose memory grows with the square of the sequence length.
    """
    scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("...qk,...kd->...qd", torch.softmax(scores, dim=-1), v)


def reference_attention(q, k, v, is_causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 output O and logsumexp L (natural log, of the scaled scores) for the tests."""
    q, k, v = q.double(), k.double(), v.double()
    scores = torch.einsum("bqd,bkd->bqk", q, k) / math.sqrt(q.shape[-1])
    if is_causal:
        scores = scores.masked_fill(~causal_mask(q.shape[1], k.shape[1], q.device), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.einsum("bqk,bkd->bqd", torch.exp(scores - lse[..., None]), v), lse


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
    """FLOPs of the useful work, FlashAttention's convention: forward = two matmuls over the attended
    pairs (4 B P D); backward = 2.5x forward (five matmuls, not counting recomputation)."""
    forward = 4.0 * batch * attended_pairs(n_queries, n_keys, is_causal) * head_dim
    return {"fwd": forward, "bwd": 2.5 * forward, "fwd+bwd": 3.5 * forward}[pass_]
