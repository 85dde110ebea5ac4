"""Rotary position embeddings, half-rotation convention ("rotate_half", as in Llama and GPT-NeoX).

For a head vector ``x = [x1, x2]`` (halves of D/2) at position t with angles ``theta_t``:
``y1 = x1*cos - x2*sin`` and ``y2 = x2*cos + x1*sin``. The backward is the rotation by ``-theta``,
the same kernel with ``sin`` negated. One program per (batch, position) rotates every head of q
and of k there, so ``cos``/``sin`` of that position are loaded once for all of them. q and k are
(B, T, H, D) and may be strided views (a slice of a fused QKV projection); the outputs are new,
contiguous tensors. On a GPU the kernel is compiled at the first call of a signature and launched
directly after it (``tritonlab._launch.launch``).
"""

import torch
import triton
import triton.language as tl

from .._launch import LaunchCache, first_launch, launch
from .._runtime import kernel_device_type, next_power_of_2
from ..checks import check_tensor


@triton.jit
def _rotate_heads(
    X, Y, base_x, base_y, n_heads, stride_xh, cos, sin, half, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr
):
    heads = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (heads < n_heads)[:, None] & (d < half)[None, :]
    x_ptr = X + base_x + heads[:, None] * stride_xh + d[None, :]
    x1 = tl.load(x_ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + half, mask=mask, other=0.0).to(tl.float32)
    y_ptr = Y + base_y + heads[:, None] * (2 * half) + d[None, :]
    tl.store(y_ptr, (x1 * cos - x2 * sin).to(Y.dtype.element_ty), mask=mask)
    tl.store(y_ptr + half, (x2 * cos + x1 * sin).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    Q,
    K,
    COS,
    SIN,
    QOUT,
    KOUT,
    seq_len,
    n_q_heads,
    n_k_heads,
    half,
    stride_qb,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_cos,
    stride_sin,
    BACKWARD: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # b * seq_len + t
    b = row // seq_len
    t = row % seq_len
    d = tl.arange(0, BLOCK_D)
    cos = tl.load(COS + t * stride_cos + d, mask=d < half, other=0.0).to(tl.float32)
    sin = tl.load(SIN + t * stride_sin + d, mask=d < half, other=0.0).to(tl.float32)
    if BACKWARD:  # the transpose of a rotation is the rotation by minus the angle
        sin = -sin
    _rotate_heads(Q, QOUT, b * stride_qb + t * stride_qt, row * n_q_heads * 2 * half, n_q_heads, stride_qh,
                  cos[None, :], sin[None, :], half, BLOCK_HQ, BLOCK_D)  # fmt: skip
    _rotate_heads(K, KOUT, b * stride_kb + t * stride_kt, row * n_k_heads * 2 * half, n_k_heads, stride_kh,
                  cos[None, :], sin[None, :], half, BLOCK_HK, BLOCK_D)  # fmt: skip


# The compiled kernel per call signature: Triton's launcher binds 22 arguments on every call.
_LAUNCHES = LaunchCache(first_launch)


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _launch(q, k, cos, sin, backward: bool):
    q, k = _unit_last(q), _unit_last(k)
    cos, sin = _unit_last(cos), _unit_last(sin)
    batch, seq_len, n_q_heads, head_dim = q.shape
    n_k_heads = k.shape[2]
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    block_hq, block_hk = next_power_of_2(n_q_heads), next_power_of_2(n_k_heads)
    block_d = next_power_of_2(head_dim // 2)
    num_warps = 4 if max(block_hq, block_hk) * block_d <= 2048 else 8
    launch(
        _LAUNCHES,
        _rope_kernel,
        (batch * seq_len,),
        (q, k, cos, sin, q_out, k_out),
        (
            seq_len,
            n_q_heads,
            n_k_heads,
            head_dim // 2,
            *q.stride()[:3],
            *k.stride()[:3],
            cos.stride(0),
            sin.stride(0),
        ),
        dict(BACKWARD=backward, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, BLOCK_D=block_d, num_warps=num_warps),
    )
    return q_out, k_out


class RoPEFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _launch(q, k, cos, sin, backward=False)

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        dq_in, dk_in = _launch(dq, dk, cos, sin, backward=True)
        return dq_in, dk_in, None, None


def _check(q, k, cos, sin):
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        check_tensor(name, t)
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(
            f"q, k: expected (B, T, H, D) tensors, got shapes {tuple(q.shape)} and {tuple(k.shape)}"
        )
    batch, seq_len, _, head_dim = q.shape
    if k.shape[0] != batch or k.shape[1] != seq_len or k.shape[3] != head_dim:
        raise ValueError(f"k: shape {tuple(k.shape)} must match q's {tuple(q.shape)} in B, T and D")
    if k.dtype != q.dtype or k.device != q.device:
        raise ValueError(f"k: dtype/device ({k.dtype}, {k.device}) must match q's ({q.dtype}, {q.device})")
    if head_dim % 2:
        raise ValueError(f"q: head dimension must be even for the half rotation, got {head_dim}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() != 2 or t.shape[0] < seq_len or t.shape[1] != head_dim // 2:
            raise ValueError(
                f"{name}: expected shape (>= {seq_len}, {head_dim // 2}) as built by rope_cache, "
                f"got {tuple(t.shape)}"
            )
        if t.device != q.device:
            raise ValueError(f"{name}: on {t.device}, but q is on {q.device}")


def rope_cache(
    seq_len: int, head_dim: int, base: float = 10000.0, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` of shape (seq_len, head_dim // 2), fp32: angle ``t * base**(-2i/head_dim)``,
    on ``device`` (default: where the kernels run, the GPU or the interpreter's CPU)."""
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim: must be a positive even number, got {head_dim}")
    if seq_len <= 0:
        raise ValueError(f"seq_len: must be positive, got {seq_len}")
    device = device or kernel_device_type()
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    angles = torch.arange(seq_len, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
    return angles.cos().float(), angles.sin().float()


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotate q (B, T, Hq, D) and k (B, T, Hk, D) by the angles whose cos/sin are (T, D/2); returns (q', k')."""
    _check(q, k, cos, sin)
    return RoPEFunction.apply(q, k, cos, sin)


class RotaryEmbedding(torch.nn.Module):
    """Holds the cos/sin cache for up to ``max_seq_len`` positions and applies :func:`rope`."""

    def __init__(self, head_dim: int, max_seq_len: int, base: float = 10000.0, device=None):
        super().__init__()
        cos, sin = rope_cache(max_seq_len, head_dim, base, device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor):
        return rope(q, k, self.cos, self.sin)


__all__ = ["RotaryEmbedding", "rope", "rope_cache"]
