"""A linear layer under autocast whose weight gradient leaves the GEMM in the weight's own dtype.

``y = x @ W^T`` with float32 weights under bf16 (or fp16) autocast: PyTorch casts W to bf16 for the
matmul, so autograd computes dW = dy^T @ x in bf16 and then casts it to float32 in a separate copy
kernel (for every weight, every step: on the H100 those copies took 3.4 ms of a 90 ms train step of
lm_bench's ``large`` model, 2 bytes read and 4 written per parameter, through PyTorch's unvectorised
dtype-converting copy). Here the backward asks cuBLAS for dW in float32 directly (``torch.mm(...,
out_dtype=torch.float32)``, the fp32 accumulator stored as is): no copy kernel, and dW is the GEMM's
float32 sum rather than that sum rounded to bf16 and widened. dx stays in the autocast dtype, as
autocast's own backward gives it.

``linears(x, weights)``: the layers that read one x (attention's q, k and v projections, SwiGLU's
gate and up) as one autograd node, whose backward accumulates dx inside the GEMMs (``addmm_``:
C += dy_i @ W_i) instead of summing the separate dx's in add kernels afterwards (three bf16 adds a
block, 1 ms of lm_bench's 67 ms large step). On a device without the float32-output GEMM (the CPU)
the backward computes dW in the autocast dtype and widens it, as autocast does. No Triton kernel:
the GEMMs are cuBLAS's.

    y = linear(x, layer.weight)                      # under torch.autocast("cuda", torch.bfloat16)
    q, k, v = linears(x, (wq.weight, wk.weight, wv.weight))

``shadows`` (a ``tritonlab.optim.WeightShadows``, or anything with its ``get(weight, dtype)``): under
autocast, a weight whose shadow in the autocast dtype is current is read from it instead of being
cast -- the cast copy kernel skipped, its result the same (the shadow is that cast, written by the
optimizer's step). A weight without a current shadow is cast as before. Gradients are unchanged:
dW comes from dy and x, in the weight's dtype.
"""

import torch
import torch.nn.functional as F

from .._runtime import autocast_dtype

__all__ = ["linear", "linears"]


def _weight_grad(dy2: torch.Tensor, x2: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """dW = dy2ᵀ @ x2 in ``dtype``: from the GEMM's float32 accumulator where cuBLAS offers it."""
    if dy2.is_cuda and dtype != dy2.dtype:
        return torch.mm(dy2.t(), x2, out_dtype=dtype)
    return (dy2.t() @ x2).to(dtype)


class _SharedInputLinear(torch.autograd.Function):
    """``x @ Wᵢᵀ`` for every weight, the GEMMs in ``dtype`` (None: the inputs' own)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dtype: torch.dtype | None, casts: tuple, *weights: torch.Tensor):
        # casts: per weight, its current shadow in ``dtype`` (used as the cast) or None
        xc = x.to(dtype) if dtype else x
        wc = [
            (c if c is not None else w.to(dtype)) if dtype else w for w, c in zip(weights, casts, strict=True)
        ]
        ctx.save_for_backward(xc, *wc)
        ctx.x_dtype, ctx.weight_dtypes = x.dtype, [w.dtype for w in weights]
        return tuple(F.linear(xc, w) for w in wc)

    @staticmethod
    def backward(ctx, *dys: torch.Tensor):
        xc, *wc = ctx.saved_tensors
        x2 = xc.reshape(-1, xc.shape[-1])
        dx, dws = None, []
        for dy, w, w_dtype, needed in zip(dys, wc, ctx.weight_dtypes, ctx.needs_input_grad[3:], strict=True):
            dy2 = dy.reshape(-1, dy.shape[-1]).to(w.dtype)
            if ctx.needs_input_grad[0]:
                # dx accumulates inside the GEMMs (C += dy @ W), not in add kernels after them
                dx = dy2 @ w if dx is None else dx.addmm_(dy2, w)
            dws.append(_weight_grad(dy2, x2, w_dtype) if needed else None)
        if dx is not None:
            dx = dx.view(xc.shape).to(ctx.x_dtype)
        return (dx, None, None, *dws)


def linears(x: torch.Tensor, weights, shadows=None) -> tuple[torch.Tensor, ...]:
    """``(x @ W₁ᵀ, x @ W₂ᵀ, ...)`` for the ``weights`` (each (out_features, in_features)) that read one
    ``x`` (..., in_features), as ``F.linear`` gives them; under autocast, in its dtype. The backward
    sums dx inside the GEMMs and gives each weight its gradient in its own dtype (float32 from
    the GEMM's accumulator under autocast, on a GPU). ``shadows``: see the module's docstring."""
    weights = tuple(weights)
    if not weights:
        raise ValueError("weights: expected at least one weight")
    for i, weight in enumerate(weights):
        _check_weight(x, weight, f"weights[{i}]")
    return _apply(x, weights, shadows)


def _check_weight(x: torch.Tensor, weight: torch.Tensor, name: str) -> None:
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(
            f"{name}: expected (out_features, {x.shape[-1]}) to match x's last dimension, got {shape}"
        )
    if weight.device != x.device:
        raise ValueError(f"{name}: on {weight.device}, but x is on {x.device}")


def _apply(x: torch.Tensor, weights: tuple, shadows) -> tuple[torch.Tensor, ...]:
    if shadows is not None and not callable(getattr(shadows, "get", None)):
        raise ValueError(
            f"shadows: expected a WeightShadows (with get(weight, dtype)) or None, got {type(shadows).__name__}"
        )
    device = x.device.type
    dtype = autocast_dtype(x)
    casts = (None,) * len(weights)
    if dtype is not None and shadows is not None:
        casts = tuple(_current_shadow(shadows, w, dtype) for w in weights)
    with torch.autocast(device, enabled=False):
        return _SharedInputLinear.apply(x, dtype, casts, *weights)


def _current_shadow(shadows, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """The shadow ``shadows`` gives for ``weight`` in ``dtype``, if it is a cast of it (same shape,
    device and dtype), else None: a weight the autocast would not cast keeps its own path."""
    if weight.dtype == dtype:
        return None
    shadow = shadows.get(weight, dtype)
    if (
        shadow is None
        or shadow.dtype != dtype
        or shadow.shape != weight.shape
        or shadow.device != weight.device
    ):
        return None
    return shadow


def linear(x: torch.Tensor, weight: torch.Tensor, shadows=None) -> torch.Tensor:
    """``F.linear(x, weight)`` (no bias); under autocast with a wider weight, dW comes out of the GEMM in
    the weight's dtype. ``x``: (..., in_features); ``weight``: (out_features, in_features);
    ``shadows``: see the module's docstring."""
    _check_weight(x, weight, "weight")
    return _apply(x, (weight,), shadows)[0]
