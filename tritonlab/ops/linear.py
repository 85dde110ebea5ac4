"""A linear layer under autocast whose weight gradient leaves the GEMM in the weight's own dtype.

``y = x @ W^T`` with float32 weights under bf16 (or fp16) autocast: PyTorch casts W to bf16 for the
matmul, so autograd computes dW = dy^T @ x in bf16 and then casts it to float32 in a separate copy
kernel (for every weight, every step: on the H100 those copies took 3.4 ms of a 90 ms train step of
lm_bench's ``large`` model, 2 bytes read and 4 written per parameter, through PyTorch's unvectorised
dtype-converting copy). Here the backward asks cuBLAS for dW in float32 directly (``torch.mm(...,
out_dtype=torch.float32)``, the fp32 accumulator stored as is): no copy kernel, and dW is the GEMM's
float32 sum rather than that sum rounded to bf16 and widened. dx stays in the autocast dtype, as
autocast's own backward gives it.

Outside autocast, or where the weight already has the autocast dtype, it is ``F.linear``. On a
device without the float32-output GEMM (the CPU) the backward computes dW in the autocast dtype and
widens it, as autocast does. No Triton kernel: the GEMMs are cuBLAS's.

    y = linear(x, layer.weight)   # under torch.autocast("cuda", torch.bfloat16)
"""

import torch
import torch.nn.functional as F

__all__ = ["linear"]


class _AutocastLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        x16, w16 = x.to(dtype), weight.to(dtype)
        ctx.save_for_backward(x16, w16)
        ctx.weight_dtype, ctx.x_dtype = weight.dtype, x.dtype
        return F.linear(x16, w16)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x16, w16 = ctx.saved_tensors
        dy = dy.to(w16.dtype)
        dx = (dy @ w16).to(ctx.x_dtype) if ctx.needs_input_grad[0] else None
        dw = None
        if ctx.needs_input_grad[1]:
            dy2, x2 = dy.reshape(-1, dy.shape[-1]), x16.reshape(-1, x16.shape[-1])
            if dy.is_cuda:
                dw = torch.mm(dy2.t(), x2, out_dtype=ctx.weight_dtype)
            else:
                dw = (dy2.t() @ x2).to(ctx.weight_dtype)
        return dx, dw, None


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)`` (no bias); under autocast with a wider weight, dW comes out of the GEMM in
    the weight's dtype. ``x``: (..., in_features); ``weight``: (out_features, in_features)."""
    if weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"weight: expected (out_features, {x.shape[-1]}) to match x's last dimension, "
            f"got {tuple(weight.shape)}"
        )
    device = x.device.type
    if not torch.is_autocast_enabled(device):
        return F.linear(x, weight)
    dtype = torch.get_autocast_dtype(device)
    if weight.dtype == dtype or not weight.is_floating_point():
        return F.linear(x, weight)
    with torch.autocast(device, enabled=False):
        return _AutocastLinear.apply(x, weight, dtype)
