"""GELU (exact or tanh), SwiGLU, ``silu(gate) * up``, and GEGLU, ``gelu_tanh(gate) * up``: element-wise, so they are only as fast as memory.

Each program takes a contiguous 4096-element slice (16 elements, two 16-byte vectors of bf16, per
thread), computes in fp32 and writes in the input's dtype. The backward kernels recompute the
activation from the saved inputs instead of saving it: one tensor less to store and to read back.
Offsets are int64, so tensors of more than 2**31 elements work. On a GPU each kernel is compiled
at the first call of a signature and launched directly after it (``tritonlab._launch.launch``).
"""

import math

import torch
import triton
import triton.language as tl

from .._launch import LaunchCache, first_launch, launch
from .._runtime import cdiv
from ..checks import check_same, check_tensor

BLOCK = 4096
NUM_WARPS = 8
# Globals read inside @triton.jit must be constexpr.
SQRT_HALF = tl.constexpr(1.0 / math.sqrt(2.0))
INV_SQRT_2PI = tl.constexpr(1.0 / math.sqrt(2.0 * math.pi))
SQRT_2_OVER_PI = tl.constexpr(math.sqrt(2.0 / math.pi))
TANH_COEF = tl.constexpr(0.044715)


@triton.jit
def _gelu_and_slope(x, APPROX_TANH: tl.constexpr):
    """GELU(x) and its derivative, in fp32."""
    if APPROX_TANH:
        # 0.5 * (1 + tanh(u)) = sigmoid(2u): no cancellation where tanh(u) is near -1, and no libdevice
        # call, so the interpreter runs it too. 1 - tanh(u)**2 = 4 * s * (1 - s).
        u = SQRT_2_OVER_PI * (x + TANH_COEF * x * x * x)
        s = tl.sigmoid(2.0 * u)
        y = x * s
        slope = s + 2.0 * x * s * (1.0 - s) * SQRT_2_OVER_PI * (1.0 + 3.0 * TANH_COEF * x * x)
    else:
        cdf = 0.5 * (1.0 + tl.erf(x * SQRT_HALF))
        y = x * cdf
        slope = cdf + x * INV_SQRT_2PI * tl.exp(-0.5 * x * x)
    return y, slope


# The six kernels open alike (offsets, mask, fp32 loads): written out, each stays a plain flat kernel.
@triton.jit
def _gelu_fwd_kernel(X, Y, n, APPROX_TANH: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    y, _ = _gelu_and_slope(x, APPROX_TANH)
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_bwd_kernel(DY, X, DX, n, APPROX_TANH: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
    _, slope = _gelu_and_slope(x, APPROX_TANH)
    tl.store(DX + offs, (dy * slope).to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_fwd_kernel(GATE, UP, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(GATE + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(UP + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + offs, (g * tl.sigmoid(g) * u).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(DY, GATE, UP, DGATE, DUP, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(GATE + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(UP + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(g)
    silu = g * s
    # d silu / dg = s + g*s*(1-s) = s * (1 + g*(1-s))
    tl.store(DGATE + offs, (dy * u * s * (1.0 + g * (1.0 - s))).to(DGATE.dtype.element_ty), mask=mask)
    tl.store(DUP + offs, (dy * silu).to(DUP.dtype.element_ty), mask=mask)


@triton.jit
def _geglu_fwd_kernel(GATE, UP, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(GATE + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(UP + offs, mask=mask, other=0.0).to(tl.float32)
    act, _ = _gelu_and_slope(g, True)
    tl.store(Y + offs, (act * u).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _geglu_bwd_kernel(DY, GATE, UP, DGATE, DUP, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(GATE + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(UP + offs, mask=mask, other=0.0).to(tl.float32)
    act, slope = _gelu_and_slope(g, True)
    tl.store(DGATE + offs, (dy * u * slope).to(DGATE.dtype.element_ty), mask=mask)
    tl.store(DUP + offs, (dy * act).to(DUP.dtype.element_ty), mask=mask)


# The compiled kernels per call signature: at small sizes Triton's launcher, not the GPU, decides
# an element-wise op's time.
_LAUNCHES = LaunchCache(first_launch)


def _launch(kernel, tensors: tuple, n: int, **constexprs) -> None:
    """``kernel`` over ``n`` elements of the flat ``tensors``, BLOCK at a time."""
    launch(
        _LAUNCHES,
        kernel,
        (cdiv(n, BLOCK),),
        tensors,
        (n,),
        dict(constexprs, BLOCK=BLOCK, num_warps=NUM_WARPS),
    )


def _dense(t: torch.Tensor) -> torch.Tensor:
    """The flat kernels index memory linearly: anything but a contiguous tensor is copied first."""
    return t if t.is_contiguous() else t.contiguous()


class GELUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, approx_tanh):
        x = _dense(x)
        y = torch.empty_like(x)
        _launch(_gelu_fwd_kernel, (x, y), x.numel(), APPROX_TANH=approx_tanh)
        ctx.save_for_backward(x)
        ctx.approx_tanh = approx_tanh
        return y

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        dy = _dense(dy)
        dx = torch.empty_like(x)
        _launch(_gelu_bwd_kernel, (dy, x, dx), x.numel(), APPROX_TANH=ctx.approx_tanh)
        return dx, None


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU like ``torch.nn.functional.gelu``: ``approximate`` is "none" (erf) or "tanh"."""
    check_tensor("x", x)
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
    return GELUFunction.apply(x, approximate == "tanh")


class GatedFunction(torch.autograd.Function):
    """``act(gate) * up`` through a (forward, backward) kernel pair: SwiGLU's or GEGLU's. The
    backward recomputes the activation from the saved inputs."""

    @staticmethod
    def forward(ctx, gate, up, kernels):
        fwd_kernel, ctx.bwd_kernel = kernels
        gate, up = _dense(gate), _dense(up)
        y = torch.empty_like(gate)
        _launch(fwd_kernel, (gate, up, y), gate.numel())
        ctx.save_for_backward(gate, up)
        return y

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        dy = _dense(dy)
        dgate, dup = torch.empty_like(gate), torch.empty_like(up)
        _launch(ctx.bwd_kernel, (dy, gate, up, dgate, dup), gate.numel())
        return dgate, dup, None


def _gated(gate: torch.Tensor, up: torch.Tensor, kernels) -> torch.Tensor:
    check_tensor("gate", gate)
    check_tensor("up", up)
    check_same("up", up, "gate", gate)
    return GatedFunction.apply(gate, up, kernels)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``; the backward recomputes ``silu(gate)`` from the saved inputs."""
    return _gated(gate, up, (_swiglu_fwd_kernel, _swiglu_bwd_kernel))


def geglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``gelu(gate, approximate="tanh") * up`` (Gemma, T5 MLPs) in one pass, rounded once; the
    backward recomputes the GELU and its slope from the saved inputs, also in one pass."""
    return _gated(gate, up, (_geglu_fwd_kernel, _geglu_bwd_kernel))


class GELU(torch.nn.Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu(x, self.approximate)


class SwiGLU(torch.nn.Module):
    """Takes the concatenated ``[gate, up]`` projection (last dimension 2F) and returns F features."""

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return swiglu(gate, up)


class GEGLU(torch.nn.Module):
    """Takes the concatenated ``[gate, up]`` projection (last dimension 2F) and returns F features."""

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return geglu(gate, up)


__all__ = ["GEGLU", "GELU", "SwiGLU", "geglu", "gelu", "swiglu"]
