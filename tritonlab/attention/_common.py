"""What both attention families compute alike: input checks, the online-softmax tile, the backward's
preprocess Δ = rowsum(dO ∘ O), the tuning keys and timing, and the config-space pruning.

Private to the package: the public names live in ``tritonlab.attention``.
"""

import math

import torch
import triton
import triton.language as tl

from .._launch import LaunchCache, first_launch, launch
from .._runtime import cdiv
from ..checks import FLOAT_DTYPES, check_tensor
from ..tuning import dot_precision, fits_shared_memory

LOG2E = math.log2(math.e)
HEAD_DIMS = (16, 32, 64, 128)


# --- input checks -----------------------------------------------------------------------------


def check_qkv(
    q, k, v, *, ndim: int, dtypes=FLOAT_DTYPES, head_dims=HEAD_DIMS, kernel_device: bool = True
) -> None:
    """q, k, v: tensors of ``ndim`` dimensions (..., L, D) with one dtype and device (the kernels'
    device, with ``kernel_device``), the same leading dimensions, k and v of one length, one head dim
    in ``head_dims`` (None: any), every dimension >= 1. A ``ValueError`` names the argument at fault."""
    layout = "(B, H, L, D)" if ndim == 4 else "(batch, seq, head_dim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != ndim:
            hint = " (fold the heads into the batch dimension)" if ndim == 3 else ""
            raise ValueError(f"{name}: expected {ndim} dimensions {layout}, got shape {tuple(t.shape)}{hint}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
            raise ValueError(f"{name}: unsupported dtype {t.dtype}; expected one of {names}")
        if t.dtype != q.dtype:
            raise ValueError(f"{name}: dtype {t.dtype} differs from q's {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: on {t.device}, but q is on {q.device}; all must share one device")
    if kernel_device:  # the device the kernels run on: cuda, or cpu in the interpreter
        check_tensor("q", q, dtypes)
    lead = q.shape[:-2]
    for name, t in (("k", k), ("v", v)):
        if t.shape[:-2] != lead:
            what = "batch and heads" if ndim == 4 else "batch size"
            raise ValueError(f"{name}: {what} {tuple(t.shape[:-2])} differ from q's {tuple(lead)}")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v: {v.shape[-2]} keys, but k has {k.shape[-2]}; they must match")
    if k.shape[-1] != q.shape[-1] or v.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"k, v: head dim {k.shape[-1]}, {v.shape[-1]} differ from q's head dim {q.shape[-1]}"
        )
    if head_dims is not None and q.shape[-1] not in head_dims:
        raise ValueError(f"q: unsupported head dim D={q.shape[-1]}; expected one of {head_dims}")
    if min(q.shape) < 1 or min(k.shape) < 1:
        raise ValueError(f"q, k: every dimension must be >= 1, got q {tuple(q.shape)}, k {tuple(k.shape)}")


def check_kv(kv) -> None:
    """kv: K and V packed as a model projects them, (B, Lk, 2, H, D), else a ``ValueError`` naming
    it (``check_qkv`` then checks the halves against q)."""
    if not isinstance(kv, torch.Tensor) or kv.dim() != 5 or kv.shape[2] != 2:
        got = tuple(kv.shape) if isinstance(kv, torch.Tensor) else type(kv).__name__
        raise ValueError(f"kv: expected K and V packed as (B, Lk, 2, H, D), got {got}")


def softmax_scale(head_dim: int, scale: float | None) -> float:
    """1/sqrt(D) unless given; a positive finite number either way."""
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale: must be a positive finite number, got {scale}")
    return scale


def strides4(t: torch.Tensor) -> tuple:
    return tuple(t.stride())


# --- the online-softmax tile, shared by both forwards --------------------------------------------


@triton.jit
def online_softmax_tile(acc, m_i, l_i, s, v, qk_scale, DOT_PRECISION: tl.constexpr):
    """Fold one tile of raw scores ``s`` (masked to -inf where a key does not count) and its V tile
    into a query block's running (acc, m, l); m and l live in base 2 (scores times qk_scale).

    The row maximum is taken on the raw scores and scaled once per row (qk_scale > 0), so each score
    costs one fused multiply-add (scale, subtract max) before its exp2; P·V accumulates into acc
    inside the dot.
    """
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = tl.math.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)  # rescales what earlier tiles accumulated
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i


# --- the backward's preprocess, shared by both backwards ----------------------------------------


@triton.jit
def load_rows(
    base,
    stride_l,
    stride_d,
    row_start,
    Lq,
    BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    CHECK: tl.constexpr,
):
    """A (BLOCK_M, HEAD_DIM) tile of one head's (L, D) matrix; with CHECK, rows past Lq read as zeros."""
    ptr = tl.make_block_ptr(
        base, (Lq, HEAD_DIM), (stride_l, stride_d), (row_start, 0), (BLOCK_M, HEAD_DIM), (1, 0)
    )
    if CHECK:
        return tl.load(ptr, boundary_check=(0,), padding_option="zero")
    return tl.load(ptr)


@triton.jit
def store_rows(base, stride_l, stride_d, row_start, Lq, tile, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """``tile`` (BLOCK_M, HEAD_DIM) into one head's (L, D) matrix from ``row_start``, in the matrix's
    dtype; rows past Lq are not written."""
    ptr = tl.make_block_ptr(
        base, (Lq, HEAD_DIM), (stride_l, stride_d), (row_start, 0), (BLOCK_M, HEAD_DIM), (1, 0)
    )
    tl.store(ptr, tile.to(base.dtype.element_ty), boundary_check=(0,))


@triton.jit
def row_delta(o, do):
    """Δ of a query tile: rowsum(dO ∘ O) in fp32."""
    return tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)


@triton.jit
def _delta_kernel(
    O, DO, DELTA, ZERO,
    stride_ob, stride_oh, stride_ol, stride_od,
    stride_gb, stride_gh, stride_gl, stride_gd,
    stride_zb, stride_zh, stride_zl, stride_zd,
    H, Lq,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    b, h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)
    row = pid_m * BLOCK_M
    o = load_rows(O + b * stride_ob + h * stride_oh, stride_ol, stride_od, row, Lq, BLOCK_M, HEAD_DIM, True)
    do = load_rows(DO + b * stride_gb + h * stride_gh, stride_gl, stride_gd, row, Lq, BLOCK_M, HEAD_DIM, True)
    rows = row + tl.arange(0, BLOCK_M)
    tl.store(DELTA + pid_bh.to(tl.int64) * Lq + rows, row_delta(o, do), mask=rows < Lq)
    if ZERO is not None:  # the fused backward's float32 dQ sum, zeroed in the same pass
        zeros = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        store_rows(
            ZERO + b * stride_zb + h * stride_zh, stride_zl, stride_zd, row, Lq, zeros, BLOCK_M, HEAD_DIM
        )


DELTA_ROWS = 64


def backward_delta(o: torch.Tensor, do: torch.Tensor, zero: torch.Tensor | None = None) -> torch.Tensor:
    """Δ = rowsum(dO ∘ O), float32 of o's leading shape (B, H, Lq) or (B, Lq): the preprocess both
    backwards subtract from dP. o and do are (B, H, L, D) or (B, L, D), any strides. ``zero``, a
    float32 tensor of o's shape in any strides, is set to zeros by the same launch (the fused
    backward's dQ sum: one pass over the rows instead of a separate fill)."""
    o4, do4 = (o, do) if o.dim() == 4 else (o.unsqueeze(1), do.unsqueeze(1))
    z4 = zero if zero is None or zero.dim() == 4 else zero.unsqueeze(1)
    B, H, Lq, D = o4.shape
    delta = torch.empty(o.shape[:-1], dtype=torch.float32, device=o.device)
    z_strides = strides4(z4) if z4 is not None else (0, 0, 0, 0)
    launch(
        _DELTA_LAUNCHES, _delta_kernel, (cdiv(Lq, DELTA_ROWS), B * H), (o4, do4, delta, z4),
        (*strides4(o4), *strides4(do4), *z_strides, H, Lq), {"HEAD_DIM": D, "BLOCK_M": DELTA_ROWS},
    )  # fmt: skip
    return delta


# Δ's launch per signature, direct after the first: Triton's launcher binds the kernel's 13 arguments
# on every call, host time that shows where a whole backward takes a tenth of a millisecond.
_DELTA_LAUNCHES = LaunchCache(first_launch)


# --- tuning: keys, timing, and config spaces that fit the GPU ------------------------------------


# A tail block is split only where it has this many tiles (below, a chunk's fixed cost -- its
# operands loaded again, its float32 share combined -- outweighs what it saves), into at most
# TAIL_MAX_SPLIT chunks.
TAIL_MIN_TILES = 16
TAIL_MAX_SPLIT = 8


def tail_split(programs: int, sms: int, n_tiles: int) -> tuple[int, int]:
    """(tail blocks, split) for a launch of ``programs`` equal blocks of work on ``sms`` SMs (one
    program an SM), each a loop over ``n_tiles`` tiles: the last wave's blocks, where they fill at
    most half the SMs, each run as ``split`` programs over a chunk of the tiles (the Gluon backward's
    query tiles, the Gluon forward's key tiles), so that the wave takes a fraction of a block's time
    instead of a whole one. (0, 1): no split."""
    tail = programs % sms
    if tail == 0 or tail > sms // 2 or n_tiles < TAIL_MIN_TILES:
        return 0, 1
    split = min(sms // tail, TAIL_MAX_SPLIT)
    return (tail, split) if split > 1 else (0, 1)


def shape_bucket(n: int) -> int:
    """Autotuning is keyed on powers of 4, so nearby lengths share one tuned config."""
    return 4 ** max(math.ceil(math.log(max(n, 1), 4)), 0)


def tuning_bench(kernel_call, quantiles):
    # Each candidate gets 60 ms of timing: about 30 calls at the mid shape, where the candidates lie
    # within 5% of each other and 10 calls let the noise pick; at the large shape one call takes
    # ~0.2 s, so it stays one call.
    return triton.testing.do_bench(kernel_call, warmup=5, rep=60, quantiles=quantiles)


def tile_smem_bytes(
    element_size: int, head_dim: int, *, fixed_rows: int, streamed_rows: int, stages: int
) -> int:
    """Shared memory of a loop that keeps ``fixed_rows`` rows of D values staged once (its own tile)
    and buffers ``streamed_rows`` rows per pipeline stage (the tiles it streams past them)."""
    per_row = element_size * head_dim
    return per_row * (fixed_rows + streamed_rows * max(stages, 1))


def fits(element_size: int, head_dim: int, *, fixed_rows: int, streamed_rows: int, stages: int) -> bool:
    """Whether such a loop fits this GPU's shared memory (the interpreter has no limit), with 10% to
    spare for what the estimate leaves out (layout conversions, barriers)."""
    need = tile_smem_bytes(
        element_size, head_dim, fixed_rows=fixed_rows, streamed_rows=streamed_rows, stages=stages
    )
    return fits_shared_memory(need, headroom=1.1)


def small_tiles_only(element_size: int, head_dim: int) -> bool:
    """Whether only tiles up to 64 x 64 are tried: D = 128 or float32 tiles above it overflow
    registers; and IEEE float32 dots run on the FMA units, where each larger tile's unrolled products
    cost minutes of compiling (one float32 fused-backward test tuned for 276 s on the H100)."""
    fma = element_size == 4 and dot_precision(torch.float32) == "ieee"
    return fma or element_size * head_dim > 256


def smallest(configs, *names: str):
    """The config with the smallest tile area over ``names``: the fallback when every one is pruned."""
    return [min(configs, key=lambda c: math.prod(c.kwargs[n] for n in names))] if configs else []


def config_string(cfg, fixed: dict | None = None) -> str:
    """A chosen config as a compact string for CSV rows (``fixed``: the interpreter's one config)."""
    if cfg is None:
        return "interpreter:" + ",".join(f"{k}={v}" for k, v in (fixed or {}).items())
    if isinstance(cfg, str):
        return cfg
    kw = dict(cfg.kwargs)
    loader = {True: ",tma", False: ",blockptr"}.get(kw.pop("USE_TMA", None), "")
    kw.pop("GROUP_BH", None)
    kw.pop("WARP_SPECIALIZE", None)
    tiles = ",".join(f"{k}={v}" for k, v in kw.items())
    return f"{tiles},warps={cfg.num_warps},stages={cfg.num_stages}{loader}"
