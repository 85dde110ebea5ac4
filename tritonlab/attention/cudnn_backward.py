"""Our attention forward with cuDNN's backward: the fastest pairing on the H100 at the model's shapes.

    o = attention_with_cudnn_backward(q, k, v)   # forward: forward.py (Gluon on Hopper); backward: cuDNN

The forward is ``attention_forward``'s (on Hopper at >= 1 000 keys the warp-specialised Gluon kernel,
1.16-1.30x cuDNN's forward at the model's mid and large shapes); the backward is cuDNN's, through
PyTorch's ``aten::_scaled_dot_product_cudnn_attention_backward``, given our o and lse. That pairing
is exact, not an approximation: cuDNN's backward needs only o and the per-row logsumexp of the scaled
scores, and our lse is that logsumexp in cuDNN's own convention (natural log, float32; it matches
the logsumexp cuDNN's forward saves to 2e-6 at mid and 5e-6 at large, and the gradients from the
pairing match cuDNN's own to 2.5-4.6e-4 relative, bf16's rounding). Measured on the H100
(``reports/data/03_attn_bwd/diagnostics/cudnn_backward_*.txt``): forward + backward 7.35 ms at mid
against cuDNN's 7.56 and our two-pass backward's 7.86; 643 ms at large against 680 and 705.

cuDNN's SDPA takes bf16 or fp16 on a CUDA GPU with cuDNN (compute capability >= 8.0) and head dims
that are multiples of 8 up to 128, and not one query over one key; elsewhere (the CPU, fp32) the
call is a ``ValueError`` naming what is missing -- ``attention`` is the path that runs everywhere. The backward is cuDNN's: not ours to
make deterministic.
"""

import torch

from ..tuning import ConfigRecord
from ._common import check_qkv
from .backward import _attend, _attention_ops, _key_grad_buffers, _like_q_layout

CUDNN_DTYPES = (torch.bfloat16, torch.float16)


def unsupported_reason(q: torch.Tensor, k: torch.Tensor) -> str | None:
    """Why cuDNN's attention backward cannot take the call of q over k, or None."""
    if not q.is_cuda:
        return f"a CUDA GPU (q is on {q.device})"
    if not torch.backends.cudnn.is_available():
        return "cuDNN (torch.backends.cudnn.is_available() is False)"
    if torch.cuda.get_device_capability(q.device) < (8, 0):
        return f"compute capability >= 8.0, got {torch.cuda.get_device_capability(q.device)}"
    if q.dtype not in CUDNN_DTYPES:
        return f"bf16 or fp16 inputs, got {q.dtype}"
    if q.shape[-1] % 8 or q.shape[-1] > 128:
        return f"a head dim that is a multiple of 8 up to 128, got {q.shape[-1]}"
    if q.shape[2] == k.shape[2] == 1:
        return "more than one query or key (cuDNN: 's_q = s_kv = 1 is not supported')"
    return None


def _cudnn_backward(q, k, v, o, lse, do, scale: float, record: ConfigRecord | None = None):
    """dQ (in q's layout) and the stacked (dK, dV) -- what the two-pass backward returns -- from
    cuDNN's backward at o and lse (B, H, Lq), our forward's."""
    Lq, Lk = q.shape[2], k.shape[2]
    no_dropout = torch.empty((), dtype=torch.int64, device=q.device)  # philox seed and offset, unused
    # Every tensor contiguous in (B, H, L, D): with dO in o's own (B, Lq, H, D) layout -- the model's --
    # the op returned wrong gradients (3.3 against 1.4 at (1, 2, 2, 2) on the H100), and in the
    # compiled model, whose q, k, v reach it in Inductor's layouts, wrong ones too (relative error
    # 0.8-1.0 of every parameter's gradient at mid and large with only dO made contiguous).
    q, k, v, o, do = (t.contiguous() for t in (q, k, v, o, do))
    dq, dk, dv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        do, q, k, v, o, lse.unsqueeze(-1), no_dropout, no_dropout, None, None, None, Lq, Lk, 0.0, False, scale=scale
    )  # fmt: skip
    # The layouts the custom op's fake promises (and the two-pass backward returns).
    dq_out = _like_q_layout(q)
    dq_out.copy_(dq)
    dkv = _key_grad_buffers(k, n_chunks=1)[0]
    dkv[0].copy_(dk)
    dkv[1].copy_(dv)
    if record is not None:
        record.note("dkdv", "cudnn")
        record.note("dq", "cudnn")
    return dq_out, dkv


_CUDNN_BACKWARD_FORWARD = _attention_ops("attention_cudnn_backward", _cudnn_backward)


# Public signature as attention's: only the backward differs.
def attention_with_cudnn_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    *,
    record: ConfigRecord | None = None,
) -> torch.Tensor:
    """Differentiable rectangular attention, softmax(scale · q kᵀ) v: our forward, cuDNN's backward.
    Inputs as ``attention``'s, bf16 or fp16 on a CUDA GPU with cuDNN, D a multiple of 8 up to 128
    (elsewhere a ``ValueError`` naming what is missing). ``record`` receives the forward's config and
    "cudnn" for the backward's; it cannot be passed under torch.compile."""
    check_qkv(q, k, v, ndim=4)
    reason = None if torch.compiler.is_compiling() else unsupported_reason(q, k)
    if reason is not None:
        raise ValueError(f"q: cuDNN's attention backward needs {reason}; attention() runs everywhere")
    return _attend(
        q, k, v, scale, record, _cudnn_backward, _CUDNN_BACKWARD_FORWARD, "attention_with_cudnn_backward"
    )


__all__ = ["attention_with_cudnn_backward", "unsupported_reason"]
