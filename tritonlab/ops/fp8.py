"""FP8 (e4m3) quantisation with fp32 scales, per row or per block of ``block`` consecutive elements.

``scale = amax / 448`` (448 is e4m3's largest finite value) for each row or block, and
``q = round_to_e4m3(x / scale)``, so the largest magnitude maps onto 448 and nothing saturates;
``dequantize_fp8(q, scales) = q * scale``. ``granularity="row"`` gives scales of shape (rows, 1),
the layout of ``torch._scaled_mm``'s row-wise scaling; ``"block"`` splits each row into groups of
``block`` elements (1 x block tiles, the activation layout of DeepSeek-V3-style training) and gives
(rows, ceil(width / block)) scales. An all-zero row or block gets scale 1. One program holds whole
rows in registers as a (rows, groups, block) tile: x is read once, q and the scales written once.
Its launch settings follow the row width alone (``_layout``: about 2048 values per program, 16 per
thread); nothing is staged in shared memory, so no element size or GPU limit can make one fail. On a
GPU each kernel is compiled at the first call of a signature and launched directly after it
(``tritonlab._launch.launch``).
"""

import torch
import triton
import triton.language as tl

from .._launch import LaunchCache, first_launch, launch
from .._runtime import cdiv, next_power_of_2
from ..checks import as_rows, check_row_width, check_tensor

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
GRANULARITIES = ("row", "block")


@triton.jit
def round_to_e4m3(v):
    """Round fp32 ``v`` (|v| <= 448) to the nearest e4m3 value, ties to even, so the cast after it is exact.

    The GPU's conversion rounds the same way; doing it here makes the interpreter (whose fp8 cast drops
    the carry when rounding up crosses a power of two) agree with it bit for bit.
    """
    bits = v.to(tl.int32, bitcast=True)
    # Normal range: keep 3 of fp32's 23 mantissa bits; adding half an ulp (minus one, plus the kept
    # lowest bit) before clearing the rest rounds to nearest even, carrying into the exponent if needed.
    keep_lsb = (bits >> 20) & 1
    normal = ((bits + 0x7FFFF + keep_lsb) & -1048576).to(tl.float32, bitcast=True)  # -1048576 == 0xFFF00000
    # Subnormals (|v| < 2**-6) are multiples of 2**-9: adding and removing 1.5 * 2**14 rounds to one.
    # Done on |v| with the sign put back, so a negative value rounding to zero gives -0 as the cast does.
    magnitude = (tl.abs(v) + 24576.0) - 24576.0
    subnormal = magnitude * tl.where(v < 0.0, -1.0, 1.0)  # (Triton's unary minus is 0 - x: +0, not -0)
    return tl.where(tl.abs(v) < 0.015625, subnormal, normal)


@triton.jit
def _quantize_kernel(
    X,
    Q,
    SCALES,
    n_rows,
    n_cols,
    n_groups,
    stride_x,
    stride_q,
    stride_s,
    BLOCK_M: tl.constexpr,
    BLOCK_G: tl.constexpr,
    GROUP: tl.constexpr,
):
    row_ids = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    group_ids = tl.arange(0, BLOCK_G)
    rows = row_ids[:, None, None]
    cols = group_ids[None, :, None] * GROUP + tl.arange(0, GROUP)[None, None, :]
    mask = (rows < n_rows) & (cols < n_cols)
    x = tl.load(X + rows * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=2)
    scale = tl.where(amax > 0.0, amax / 448.0, 1.0)
    q = tl.clamp(x * (1.0 / scale)[:, :, None], -448.0, 448.0)  # clamp: x*(1/scale) may round past 448
    tl.store(Q + rows * stride_q + cols, round_to_e4m3(q).to(Q.dtype.element_ty), mask=mask)
    tl.store(
        SCALES + row_ids[:, None] * stride_s + group_ids[None, :],
        scale,
        mask=(row_ids[:, None] < n_rows) & (group_ids[None, :] < n_groups),
    )


@triton.jit
def _dequantize_kernel(
    Q,
    SCALES,
    Y,
    n_rows,
    n_cols,
    n_groups,
    stride_q,
    stride_s,
    stride_y,
    BLOCK_M: tl.constexpr,
    BLOCK_G: tl.constexpr,
    GROUP: tl.constexpr,
):
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)[:, None, None]
    groups = tl.arange(0, BLOCK_G)[None, :, None]
    cols = groups * GROUP + tl.arange(0, GROUP)[None, None, :]
    mask = (rows < n_rows) & (cols < n_cols)
    q = tl.load(Q + rows * stride_q + cols, mask=mask, other=0.0).to(tl.float32)
    scale = tl.load(SCALES + rows * stride_s + groups, mask=(rows < n_rows) & (groups < n_groups), other=0.0)
    tl.store(Y + rows * stride_y + cols, (q * scale).to(Y.dtype.element_ty), mask=mask)


def _layout(n_cols: int, granularity: str, block: int) -> tuple[int, int, int, int, int]:
    """(groups per row, padded groups, group width, rows per program, warps)."""
    if granularity == "row":
        n_groups, group = 1, next_power_of_2(n_cols)
    else:
        n_groups, group = cdiv(n_cols, block), block
    block_g = next_power_of_2(n_groups)
    row_elems = block_g * group
    block_m = max(1, min(16, 2048 // row_elems))
    num_warps = min(32, max(4, block_m * row_elems // 512))
    return n_groups, block_g, group, block_m, num_warps


# The compiled kernels per call signature, launched directly after its first call (tritonlab._launch).
_LAUNCHES = LaunchCache(first_launch)


def _launch(kernel, a, b, c, n_cols: int, layout: tuple) -> None:
    """Run ``kernel`` with ``_layout``'s settings over the rows of the 2-D tensors ``a``, ``b``, ``c``
    (x, q, scales to quantize; q, scales, y to dequantize: both kernels take the same arguments)."""
    n_groups, block_g, group, block_m, num_warps = layout
    n_rows = a.shape[0]
    launch(
        _LAUNCHES, kernel, (cdiv(n_rows, block_m),), (a, b, c),
        (n_rows, n_cols, n_groups, a.stride(0), b.stride(0), c.stride(0)),
        dict(BLOCK_M=block_m, BLOCK_G=block_g, GROUP=group, num_warps=num_warps),
    )  # fmt: skip


def _check_granularity(granularity: str, block: int) -> None:
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity: expected 'row' or 'block', got {granularity!r}")
    if granularity == "block" and (block < 16 or block > 4096 or block & (block - 1)):
        raise ValueError(f"block: expected a power of two in [16, 4096], got {block}")


def quantize_fp8(
    x: torch.Tensor, granularity: str = "row", block: int = 128
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scales): q is float8_e4m3fn with x's shape; scales fp32 (..., 1) for rows, (..., groups) for blocks."""
    check_tensor("x", x)
    _check_granularity(granularity, block)
    if x.dim() < 1:
        raise ValueError("x: expected at least one dimension")
    check_row_width("x", x.shape[-1])
    rows = as_rows(x)
    n_rows, n_cols = rows.shape
    layout = _layout(n_cols, granularity, block)
    n_groups = layout[0]
    q = torch.empty((n_rows, n_cols), dtype=FP8_DTYPE, device=x.device)
    scales = torch.empty((n_rows, n_groups), dtype=torch.float32, device=x.device)
    _launch(_quantize_kernel, rows, q, scales, n_cols, layout)
    return q.view(x.shape), scales.view(*x.shape[:-1], n_groups)


def dequantize_fp8(
    q: torch.Tensor,
    scales: torch.Tensor,
    granularity: str = "row",
    block: int = 128,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """``q * scale`` in ``dtype``: the inverse of :func:`quantize_fp8` up to e4m3 rounding."""
    check_tensor("q", q, (FP8_DTYPE,))
    check_tensor("scales", scales, (torch.float32,))
    _check_granularity(granularity, block)
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtype: expected float32, float16 or bfloat16, got {dtype}")
    check_row_width("q", q.shape[-1])
    layout = _layout(q.shape[-1], granularity, block)
    n_groups = layout[0]
    if scales.shape != (*q.shape[:-1], n_groups):
        raise ValueError(
            f"scales: expected shape {(*q.shape[:-1], n_groups)} for {granularity} granularity, "
            f"got {tuple(scales.shape)}"
        )
    q_rows, s_rows = as_rows(q), as_rows(scales)
    n_rows, n_cols = q_rows.shape
    y = torch.empty((n_rows, n_cols), dtype=dtype, device=q.device)
    _launch(_dequantize_kernel, q_rows, s_rows, y, n_cols, layout)
    return y.view(q.shape)


__all__ = ["FP8_DTYPE", "FP8_MAX", "dequantize_fp8", "quantize_fp8", "round_to_e4m3"]
