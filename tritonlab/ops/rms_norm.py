"""RMSNorm, ``y = x / sqrt(mean(x**2) + eps) * weight`` over the last dimension, forward and backward.

Forward: each program holds whole rows in registers (several narrow rows at once), so ``x`` is read
once and ``y`` written once; the reciprocal RMS of each row (4 bytes) is kept for the backward.

Backward: ``dx = rstd * (dy*w - xhat * mean(dy*w*xhat))`` with ``xhat = x*rstd`` is again row-local,
but ``dW = sum over rows of dy*xhat`` crosses rows. A persistent grid of a few programs per SM walks
the rows, each program adding its rows' contributions into an fp32 accumulator in registers; the
per-program partial sums (programs x hidden, fp32) are then added by a small second kernel. No
atomics, so the result is deterministic.

The backward's row loop is software-pipelined: the next rows' x and dy are loaded (through shared
memory) while this block's reductions run. Its depth is pruned by the tile's bytes -- the element
size times the rows and padded width a program holds -- and the GPU's shared memory: a tile whose
prefetched copies would not fit runs unpipelined, so float32 and 65 536-wide rows always launch.

``add_rms_norm``: the residual add before a pre-norm block's norm, fused into it. The same two
kernels, specialised by constexprs (the plain norm's launches keep their defaults): the forward
also reads the residual and writes the sum s = x + residual (which the norm is of); the backward
also adds the sum's own gradient ds into dx, and writes dx a second time in the residual's dtype
where that differs from x's. Unfused, the add was a kernel each way and a cast of the gradient.

``out_dtype``: y in another dtype than x, rounded once from the float32 result -- under autocast, the
bfloat16 input of the next matmul written directly, where a float32 y would be read again by a cast
kernel (and in the backward, dy arrives in that dtype while dx keeps x's).

On a GPU each kernel is compiled at the first call of a signature and launched directly after it
(``tritonlab._launch.launch``), without Triton's per-call argument binding.
"""

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .._launch import LaunchCache, first_launch, launch
from .._runtime import cdiv, next_power_of_2, sm_count
from ..checks import as_rows, check_row_width, check_tensor, persistent_programs, row_block_settings
from ..tuning import fits_shared_memory


@dataclass(frozen=True)
class RMSNormSettings:
    """The backward's launch settings (``python -m phases kernel_suite --tune`` sweeps them).

    ``bwd_warps_per_sm``: the persistent grid fills this many warps on each SM (32 measured level
    with 16 and 64 on the H100, within 1%); ``bwd_stages``: the row loop's pipeline depth (3 measured
    fastest on the H200: 0.773 ms against 0.975 ms unpipelined at 65536 x 8192);
    ``pipeline_smem_bytes``: the most shared memory the prefetched x and dy tiles may take."""

    bwd_warps_per_sm: int = 32
    bwd_stages: int = 3
    pipeline_smem_bytes: int = 64 * 1024


DEFAULT_SETTINGS = RMSNormSettings()


@triton.jit
def _effective_weight(W, cols, col_ok, offset, HAS_OFFSET: tl.constexpr):
    """The weight in fp32, plus the offset (Gemma's ``offset + w``) where there is one."""
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    if HAS_OFFSET:
        w = tl.where(col_ok, w + offset, 0.0)
    return w


@triton.jit
def _rms_norm_fwd_kernel(
    X,
    W,
    Y,
    RSTD,
    # add_rms_norm: the residual added to x, and where their sum goes (None for the plain norm).
    R,
    S,
    n_rows,
    n_cols,
    stride_x,
    stride_y,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    # weight=None (W None), the offset and the residual: the defaults specialise to exactly the plain kernel.
    offset=0.0,
    stride_r=0,
    stride_s=0,
    HAS_WEIGHT: tl.constexpr = True,
    HAS_OFFSET: tl.constexpr = False,
    HAS_RESIDUAL: tl.constexpr = False,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    mask = row_ok[:, None] & col_ok[None, :]
    rows64 = rows.to(tl.int64)  # rows x stride can pass 2**31
    x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(R + rows64[:, None] * stride_r + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        # The sum in fp32, rounded once to S's dtype (x's); the norm is of that stored s, as the
        # backward (which reads s) and the unfused ``s = x + r; rms_norm(s)`` have it.
        s = (x + r).to(S.dtype.element_ty)
        tl.store(S + rows64[:, None] * stride_s + cols[None, :], s, mask=mask)
        x = s.to(tl.float32)
    if HAS_WEIGHT:
        w = _effective_weight(W, cols, col_ok, offset, HAS_OFFSET)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    y = x * rstd[:, None] * w[None, :] if HAS_WEIGHT else x * rstd[:, None]
    tl.store(Y + rows64[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=row_ok)


@triton.jit
def _rms_norm_bwd_kernel(
    DY,
    X,
    W,
    RSTD,
    DX,
    DW_PARTIAL,
    # add_rms_norm: the gradient of the sum s from its other uses, added into dx (None: none), and
    # where dx goes again in the residual's dtype (None: one gradient serves both).
    DS,
    DR,
    n_rows,
    n_cols,
    stride_dy,
    stride_x,
    stride_dx,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    offset=0.0,
    stride_ds=0,
    stride_dr=0,
    HAS_WEIGHT: tl.constexpr = True,
    HAS_OFFSET: tl.constexpr = False,
    HAS_DS: tl.constexpr = False,
    HAS_DR: tl.constexpr = False,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    if HAS_WEIGHT:
        w = _effective_weight(W, cols, col_ok, offset, HAS_OFFSET)
        dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    for block in tl.range(pid, tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0), num_stages=NUM_STAGES):
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < n_rows
        mask = row_ok[:, None] & col_ok[None, :]
        rows64 = rows.to(tl.int64)
        x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
        xhat = x * rstd[:, None]
        dyw = dy * w[None, :] if HAS_WEIGHT else dy
        mean_dyw_xhat = tl.sum(dyw * xhat, axis=1) / n_cols
        dx = (dyw - xhat * mean_dyw_xhat[:, None]) * rstd[:, None]
        if HAS_DS:
            ds = tl.load(DS + rows64[:, None] * stride_ds + cols[None, :], mask=mask, other=0.0)
            dx += ds.to(tl.float32)
        tl.store(DX + rows64[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        if HAS_DR:
            tl.store(DR + rows64[:, None] * stride_dr + cols[None, :], dx.to(DR.dtype.element_ty), mask=mask)
        if HAS_WEIGHT:
            dw += tl.sum(dy * xhat, axis=0)
    if HAS_WEIGHT:
        tl.store(DW_PARTIAL + pid * n_cols + cols, dw, mask=col_ok)


@triton.jit
def _sum_partials_kernel(PARTIAL, OUT, n_parts, n_cols, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """OUT[c] = sum over p of PARTIAL[p, c], in fp32, cast on the store.

    Each program sums one strip of BLOCK_C columns: (BLOCK_P, BLOCK_C) tiles added element-wise into
    an fp32 accumulator of that shape (independent loads, no reduction inside the loop), its rows
    summed once at the end. The order of the additions is fixed by the launch: deterministic."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < n_cols
    parts = tl.arange(0, BLOCK_P)
    acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
    for start in range(0, n_parts, BLOCK_P):
        rows = start + parts
        mask = (rows < n_parts)[:, None] & col_ok[None, :]
        acc += tl.load(PARTIAL + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0)
    tl.store(OUT + cols, tl.sum(acc, axis=0).to(OUT.dtype.element_ty), mask=col_ok)


_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The compiled kernels per call signature, launched directly after its first call: at small shapes
# the host time of Triton's launcher, not the GPU's, is the op's time (tritonlab._launch).
_LAUNCHES = LaunchCache(first_launch)


def _check(x, weight, eps, offset=0.0, out_dtype=None):
    check_tensor("x", x)
    if out_dtype is not None and out_dtype not in _OUT_DTYPES:
        raise ValueError(f"out_dtype: expected None or one of float32, float16, bfloat16, got {out_dtype!r}")
    if x.dim() < 1:
        raise ValueError("x: expected at least one dimension (the hidden size last)")
    if weight is not None:
        check_tensor("weight", weight)
        if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
            raise ValueError(
                f"weight: expected shape ({x.shape[-1]},) to match x's last dimension, got {tuple(weight.shape)}"
            )
        if weight.device != x.device:
            raise ValueError(f"weight: on {weight.device}, but x is on {x.device}")
    check_row_width("x", x.shape[-1])
    if not isinstance(eps, int | float) or not eps > 0:
        raise ValueError(f"eps: must be a positive number, got {eps!r}")
    if not isinstance(offset, int | float) or not math.isfinite(offset):
        raise ValueError(f"offset: expected a finite number, got {offset!r}")
    if offset != 0.0 and weight is None:
        raise ValueError("offset: scales the weight (x_hat * (offset + weight)); it needs a weight")


def _check_add(x, residual, weight, eps, out_dtype) -> None:
    """add_rms_norm's arguments: rms_norm's checks of x, weight, eps and out_dtype, and a residual of
    x's shape on x's device (either dtype of the three)."""
    _check(x, weight, eps, 0.0, out_dtype)
    check_tensor("residual", residual)
    if residual.shape != x.shape:
        raise ValueError(f"residual: shape {tuple(residual.shape)} differs from x's {tuple(x.shape)}")
    if residual.device != x.device:
        raise ValueError(f"residual: on {residual.device}, but x is on {x.device}")


def _bwd_stages(tile_bytes: int, settings: RMSNormSettings, n_tiles: int = 2) -> int:
    """``settings.bwd_stages`` where the prefetched tiles (x and dy, and add_rms_norm's ds: ``n_tiles``
    per extra stage, each of ``tile_bytes``) fit both the budget and the GPU's shared memory, else 1
    (unpipelined: a 65 536-wide row failed with 3 stages)."""
    need = n_tiles * (settings.bwd_stages - 1) * tile_bytes
    return settings.bwd_stages if need <= settings.pipeline_smem_bytes and fits_shared_memory(need) else 1


def _forward(
    x2: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    offset: float = 0.0,
    out_dtype=None,
    residual2: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """y (in ``out_dtype``, else x's), the per-row reciprocal RMS and the sum s (None without
    ``residual2``) of the (rows, width) view ``x2``: the norm of x, or with ``residual2`` (rows,
    width) of ``s = x + residual`` (in x's dtype), one kernel writing s, y and rstd."""
    n_rows, n_cols = x2.shape
    y = torch.empty((n_rows, n_cols), dtype=out_dtype or x2.dtype, device=x2.device)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x2.device)
    block_m, block_n, num_warps = row_block_settings(n_cols)
    options = _option_args(weight, offset)
    s = None
    if residual2 is not None:
        s = torch.empty((n_rows, n_cols), dtype=x2.dtype, device=x2.device)
        options.update(stride_r=residual2.stride(0), stride_s=s.stride(0), HAS_RESIDUAL=True)
    launch(
        _LAUNCHES,
        _rms_norm_fwd_kernel,
        (cdiv(n_rows, block_m),),
        (x2, weight, y, rstd, residual2, s),
        (n_rows, n_cols, x2.stride(0), y.stride(0), float(eps)),
        dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps, **options),
    )
    return y, rstd, s


def _option_args(weight, offset: float) -> dict:
    """Nothing for the plain path (a weight, no offset): its launch stays the specialisation it was."""
    args = {}
    if weight is None:
        args["HAS_WEIGHT"] = False
    if offset != 0.0:
        args.update(offset=float(offset), HAS_OFFSET=True)
    return args


# The weight gradient's partial sums (programs x width, fp32) are added by _sum_partials_kernel, one
# program per strip of columns. It was 64 columns a strip, 32 partial rows a step, each step reduced
# across its rows: on the H100 at the LM `large` size (width 1280, 1056 partial rows = 5.4 MB) that is
# 20 programs with one 8 KB tile in flight each, ~160 KB in flight on the whole GPU: latency-bound,
# 34 us a call (73 calls, 2.45 ms a training step) where Inductor's reduction of the same sum took
# 7.5 us. Now strips are as narrow as makes about two programs an SM (down to 8 fp32 columns, one
# 32-byte sector a row: the partials were just written and sit in L2), and each step loads a tile of
# PARTIALS_TILE values (16 KB) added element-wise into a 2-D accumulator, reduced across rows once:
# at width 1280, 160 programs with 16 KB each in flight, 2.6 MB. No atomics, one launch: deterministic.
# Timed in the same step on the H100 since: 7.5 us a call (0.55 ms a step).
PARTIALS_TILE = 4096
PARTIALS_STRIPS_PER_SM = 2
PARTIALS_MIN_STRIP = 8


def _sum_partials_blocks(n_parts: int, n_cols: int, device) -> tuple[int, int]:
    """(BLOCK_P, BLOCK_C) of _sum_partials_kernel: strips of columns narrow enough that about
    PARTIALS_STRIPS_PER_SM programs run on each SM (at least PARTIALS_MIN_STRIP columns, at most the
    padded width), and as many partial rows a step as make PARTIALS_TILE values (at most all of them)."""
    strips = PARTIALS_STRIPS_PER_SM * sm_count(device)
    block_c = min(
        next_power_of_2(n_cols),
        max(PARTIALS_MIN_STRIP, next_power_of_2(cdiv(n_cols, strips))),
    )
    block_p = min(next_power_of_2(n_parts), max(1, PARTIALS_TILE // block_c))
    return block_p, block_c


def _backward(
    dy2,
    x2,
    weight,
    rstd,
    settings: RMSNormSettings,
    offset: float = 0.0,
    ds2: torch.Tensor | None = None,
    residual_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """dx (rows, width), dweight (None without a weight) and dx again in ``residual_dtype`` (None
    unless that is given and differs from x's): the row kernel, then the sum of its per-program
    partial dW. add_rms_norm's backward passes ``ds2`` (rows, width), the gradient its sum s gets
    from its other uses, added into dx in the same kernel (x2 being s)."""
    n_rows, n_cols = x2.shape
    dx = torch.empty((n_rows, n_cols), dtype=x2.dtype, device=x2.device)
    block_m, block_n, num_warps = row_block_settings(n_cols)
    # As many programs as fill bwd_warps_per_sm warps on each SM; few enough that the partial sums stay small.
    per_sm = max(1, settings.bwd_warps_per_sm // num_warps)
    n_programs = persistent_programs(cdiv(n_rows, block_m), per_sm)
    partial = (
        torch.empty((n_programs, n_cols), dtype=torch.float32, device=x2.device)
        if weight is not None
        else None
    )
    options = _option_args(weight, offset)
    if ds2 is not None:
        options.update(stride_ds=ds2.stride(0), HAS_DS=True)
    dr = None
    if residual_dtype is not None and residual_dtype != x2.dtype:
        dr = torch.empty((n_rows, n_cols), dtype=residual_dtype, device=x2.device)
        options.update(stride_dr=dr.stride(0), HAS_DR=True)
    # The plain norm sizes its two prefetched tiles by x's element, as it always has; with ds, three
    # tiles of the largest element among x (s), dy and ds.
    size = x2.element_size() if ds2 is None else max(t.element_size() for t in (x2, dy2, ds2))
    stages = _bwd_stages(block_m * block_n * size, settings, n_tiles=2 if ds2 is None else 3)
    # The settings reach the launch only through the grid and NUM_STAGES, both in the launch's key.
    launch(
        _LAUNCHES,
        _rms_norm_bwd_kernel,
        (n_programs,),
        (dy2, x2, weight, rstd, dx, partial, ds2, dr),
        (n_rows, n_cols, dy2.stride(0), x2.stride(0), dx.stride(0)),
        dict(BLOCK_M=block_m, BLOCK_N=block_n, NUM_STAGES=stages, num_warps=num_warps, **options),
    )
    if weight is None:
        return dx, None, dr
    dw = torch.empty_like(weight)
    block_p, block_c = _sum_partials_blocks(n_programs, n_cols, x2.device)
    launch(
        _LAUNCHES,
        _sum_partials_kernel,
        (cdiv(n_cols, block_c),),
        (partial, dw),
        (n_programs, n_cols),
        dict(BLOCK_P=block_p, BLOCK_C=block_c, num_warps=4),
    )
    return dx, dw, dr


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, settings=DEFAULT_SETTINGS, offset=0.0, out_dtype=None):
        x2 = as_rows(x)
        y, rstd, _ = _forward(x2, weight, eps, offset, out_dtype)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.x_shape = x.shape
        ctx.settings = settings
        ctx.offset = offset
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved_tensors
        dx, dw, _ = _backward(as_rows(dy), x2, weight, rstd, ctx.settings, ctx.offset)
        return dx.view(ctx.x_shape), dw, None, None, None, None


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    offset: float = 0.0,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """RMSNorm over the last dimension of ``x`` (any leading shape, width up to 65 536), fp32 inside:
    ``x_hat * weight`` with ``x_hat = x / sqrt(mean(x**2) + eps)``; ``x_hat`` alone when ``weight`` is
    None; ``x_hat * (offset + weight)`` with an ``offset`` (Gemma's ``1 + weight``: ``offset=1.0``).
    The weight's gradient is that of ``weight`` itself (the offset is a constant). ``out_dtype``
    (float32, float16 or bfloat16): the result's dtype, rounded once from float32 (default: x's);
    the gradient of ``x`` stays in x's dtype."""
    _check(x, weight, eps, offset, out_dtype)
    return RMSNormFunction.apply(x, weight, eps, DEFAULT_SETTINGS, offset, out_dtype)


class AddRMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps, out_dtype=None, settings=DEFAULT_SETTINGS):
        y, rstd, s = _forward(as_rows(x), weight, eps, 0.0, out_dtype, residual2=as_rows(residual))
        ctx.save_for_backward(s, weight, rstd)
        ctx.set_materialize_grads(False)  # ds None where s has no other use (a final norm)
        ctx.shape, ctx.residual_dtype, ctx.settings = x.shape, residual.dtype, settings
        return s.view(x.shape), y.view(x.shape)

    @staticmethod
    def backward(ctx, ds, dy):
        s2, weight, rstd = ctx.saved_tensors
        need_x, need_r = ctx.needs_input_grad[:2]
        if dy is None:  # y unused: s passes its gradient through (None if it has none), no weight's
            gx, gr, dw = ds, None if ds is None else ds.to(ctx.residual_dtype), None
        else:
            ds2 = None if ds is None else as_rows(ds)
            residual_dtype = ctx.residual_dtype if need_r else None
            dx, dw, dr = _backward(as_rows(dy), s2, weight, rstd, ctx.settings, 0.0, ds2, residual_dtype)
            gx = dx.view(ctx.shape)
            gr = gx if dr is None else dr.view(ctx.shape)  # the same tensor for both in one dtype
        return gx if need_x else None, gr if need_r else None, dw, None, None, None


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the RMSNorm after it, fused: ``(s, y)`` with ``s = x + residual`` and
    ``y = s / sqrt(mean(s**2) + eps) * weight`` over the last dimension (``weight`` None: without it).

    ``x`` is the residual stream (float32 under autocast), ``residual`` the branch output added to it
    (bfloat16 under autocast), same shape and device, each float32, float16 or bfloat16. The sum is
    taken in fp32 and stored in x's dtype; y is the norm of that stored s, in ``out_dtype`` (default:
    s's), rounded once from fp32 -- the values of ``s = x + residual; rms_norm(s, weight, eps)`` where
    x's dtype is the promoted one. One kernel reads x and residual and writes s, y and the per-row
    reciprocal RMS.

    Backward, one row kernel: with ``g = ds + rstd * (dy*w - s_hat * mean(dy*w*s_hat))`` (``s_hat =
    s * rstd``, ``ds`` the gradient s gets from its other uses, left out where it has none), x's
    gradient is g in x's dtype and residual's g in residual's dtype, both written by the kernel when
    the dtypes differ; when they are the same, one tensor is returned for both (as autograd's own
    add does). The weight's gradient is ``sum over rows of dy * s_hat``, as in :func:`rms_norm`."""
    _check_add(x, residual, weight, eps, out_dtype)
    return AddRMSNormFunction.apply(x, residual, weight, eps, out_dtype, DEFAULT_SETTINGS)


class RMSNorm(torch.nn.Module):
    """``torch.nn.RMSNorm`` on the Triton kernels: ``RMSNorm(normalized_shape, eps, elementwise_affine,
    device, dtype)``, over the last dimension only (``normalized_shape`` an int or a 1-tuple). The
    weight starts at ones; without ``elementwise_affine`` there is none (``self.weight is None``).
    ``eps=None`` is float32's eps (PyTorch's: that of its compute dtype); the default stays 1e-6.
    ``offset`` (keyword) multiplies by ``offset + weight`` (Gemma: ``offset=1.0``, weight from zeros)."""

    def __init__(
        self,
        normalized_shape: int | tuple[int] | list[int] | torch.Size,
        eps: float | None = 1e-6,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
        *,
        offset: float = 0.0,
    ):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        if len(shape) != 1:
            raise ValueError(
                f"normalized_shape: only the last dimension is normalised here; expected an int or a "
                f"1-tuple, got {normalized_shape!r}"
            )
        if offset != 0.0 and not elementwise_affine:
            raise ValueError("offset: scales the weight, but elementwise_affine=False has none")
        self.normalized_shape = shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.offset = offset
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            # offset + weight starts at 1: ones without an offset, Gemma's zeros with offset=1.
            torch.nn.init.constant_(self.weight, 1.0 - self.offset)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}" + (
            f", offset={self.offset}" if self.offset else ""
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # eps=None: PyTorch takes the eps of the dtype it computes in, float32 for every dtype here.
        eps = torch.finfo(torch.float32).eps if self.eps is None else self.eps
        return rms_norm(x, self.weight, eps, self.offset)


__all__ = ["RMSNorm", "add_rms_norm", "rms_norm"]
