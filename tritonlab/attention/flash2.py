"""FlashAttention-2 in Triton: a forward kernel and a two-kernel backward, causal or not.

For q (B, Nq, D) over k, v (B, Nk, D) -- heads folded into the batch, as in the course this
reproduces -- o = softmax(q kᵀ / sqrt(D) + mask) v, where the causal mask keeps key j for query i
when i >= j (top-left aligned, as SDPA's ``is_causal``), and L = logsumexp of the scaled scores.

Forward: one program per (query tile, batch). It keeps its Q tile, the running max m, the running
sum l and the output accumulator on chip in fp32, streams K and V tiles through (the tile update
is ``_common.online_softmax_tile``, shared with ``forward.py``), and writes O and L once.
Backward: Δ = rowsum(dO ∘ O) first (``_common.backward_delta``, shared with ``backward.py``); dK
and dV are finished by one program per key tile that streams the query tiles past it; dQ by one
program per query tile that streams the key tiles past it. Each kernel owns what it writes, so
there are no atomics, at the price of recomputing the scores and dP twice (seven matmuls instead
of five).

Why these kernels and not ``forward.py`` / ``backward.py``'s: the algorithm differs in the causal
mask. A causal program skips the tiles above the diagonal and splits the rest into an unmasked
range and the one or two masked tiles on the diagonal, with bounds that depend on the tile; and
causal programs run heaviest first. The rectangular kernels have no mask and a 4-D (B, H, L, D)
layout with their own launch path (autotuning, direct launches); merging the two inner loops
would put branches or extra arguments into both hot loops for no gain, so the shared parts are the
tile update, the preprocess, the input checks and the shared-memory fit, and the loops stay two.

What carries the forward's speed:
- the softmax runs in base 2 (``exp2``), with 1/sqrt(d) and log2(e) folded into one factor; the row
  max is taken on the raw scores, so each score costs a single fused multiply-add;
- causal: tiles entirely above the diagonal are never visited, and the tiles entirely below it run
  a loop with no mask at all -- only the few tiles on the diagonal (or at a ragged end) pay for
  ``tl.where``;
- causal programs run heaviest first across the whole grid -- the last query tile of every batch,
  then the one before -- so the last wave is made of short programs;
- tiles move through Hopper's TMA copy engine (tensor descriptors), which also does the bounds
  checks, whenever the strides allow it; other strides fall back to block pointers.

On Hopper, for 16-bit inputs at D 64 or 128 with TMA-addressable strides, from GLUON_FROM_N keys
on, the forward is ``forward_hopper``'s warp-specialised Gluon kernel and the dK/dV pass
``backward_hopper``'s, both with the causal mask on the diagonal tiles only; dQ stays this
module's Triton kernel. ``impl`` ("auto", "triton", "gluon") pins a family.

Tiles come from the tuned-config table for the GPU where it has an entry (``tritonlab.tuning_tables``,
written by phase 11 from ``TUNE_CANDIDATES``; ``TRITONLAB_AUTOTUNE=off`` or ``full`` skip it), else
from a table per kernel here (measured with ``python -m phases flash2 flash-bench --tune``), shrunk
where a tile would not fit the GPU's shared memory at the inputs' element size.
"""

import logging
import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from .._launch import tma_ok, use_descriptor_scratch
from .._runtime import INTERPRET, cdiv
from ..checks import check_choice
from ..tuning import dot_precision
from ..tuning_tables import TUNER, dtype_name, gpu_slug
from . import backward_hopper, forward_hopper
from ._common import HEAD_DIMS, LOG2E, backward_delta, check_qkv, fits, online_softmax_tile

TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LOADERS = ("auto", "tma", "blockptr")
# "auto": the Gluon kernels (forward_hopper, backward_hopper's dK/dV) where they can run, from
# GLUON_FROM_N keys on; else Triton.
IMPLS = ("auto", "triton", "gluon")
GLUON_FROM_N = 2048


@dataclass(frozen=True)
class TileConfig:
    """One kernel's launch settings."""

    block_m: int  # queries per tile
    block_n: int  # keys per tile
    num_warps: int
    num_stages: int


# The interpreter runs every program in Python: small tiles keep the CPU tests quick.
_INTERPRETER_CONFIGS = {kernel: TileConfig(16, 16, 4, 1) for kernel in ("fwd", "dq", "dkdv")}
_GPU_CONFIGS = {
    # (kernel, 16-bit inputs?, head dim <= 64?) -> tiles. d <= 32 reuses the d = 64 choice untuned.
    # Forward (TMA loads, causal bf16): the tile with the best worst-case ratio to SDPA cuDNN over
    # (16, 4096), (4, 16384), (16, 16384) at d = 64 and (16, 4096), (4, 16384) at d = 128.
    ("fwd", True, True): TileConfig(128, 128, 4, 3),
    ("fwd", True, False): TileConfig(128, 128, 8, 3),
    # Backward: `flash-bench --tune` on an H100 at (16, 16384, 64) and (8, 8192, 128), causal bf16.
    ("dq", True, True): TileConfig(128, 64, 4, 3),
    ("dq", True, False): TileConfig(64, 64, 4, 3),
    ("dkdv", True, True): TileConfig(32, 64, 4, 4),
    ("dkdv", True, False): TileConfig(128, 128, 8, 2),
    # fp32 tiles take twice the shared memory: smaller tiles. (Rows alike by shape: a table, not code.)
    ("fwd", False, True): TileConfig(64, 64, 4, 2),
    ("fwd", False, False): TileConfig(64, 32, 4, 2),
    ("dq", False, True): TileConfig(64, 64, 4, 2),
    ("dq", False, False): TileConfig(64, 32, 4, 2),
    ("dkdv", False, True): TileConfig(64, 64, 4, 2),
    ("dkdv", False, False): TileConfig(32, 64, 4, 2),
}
# Non-causal calls where the causal tuning fits badly: at d = 128 the 128 x 128 dK/dV tile makes a
# non-causal backward 2.2x slower than 32 x 64, which is within 1% of the best there; the causal
# backward keeps 128 x 128 (10% ahead).
_NON_CAUSAL_CONFIGS = {("dkdv", True, False): TileConfig(32, 64, 4, 3)}


def _table_config(kernel: str, dtype: torch.dtype, head_dim: int, causal: bool) -> TileConfig:
    """The GPU table's tiles for a call, before the shared-memory fit."""
    key = (kernel, dtype != torch.float32, head_dim <= 64)
    return (None if causal else _NON_CAUSAL_CONFIGS.get(key)) or _GPU_CONFIGS[key]


def _fits(cfg: TileConfig, kernel: str, element_size: int, head_dim: int) -> bool:
    """Shared memory of a kernel's loop: the forward keeps Q and streams K, V; dQ keeps Q, dO and
    streams K, V; dK/dV keeps K, V and streams Q, dO."""
    bm, bn = cfg.block_m, cfg.block_n
    fixed, streamed = {"fwd": (bm, 2 * bn), "dq": (2 * bm, 2 * bn), "dkdv": (2 * bn, 2 * bm)}[kernel]
    return fits(element_size, head_dim, fixed_rows=fixed, streamed_rows=streamed, stages=cfg.num_stages)


def _fit(cfg: TileConfig, kernel: str, element_size: int, head_dim: int) -> TileConfig:
    """``cfg``, or the nearest smaller tiles that fit this GPU: fewer stages first, then halved tiles."""
    while not _fits(cfg, kernel, element_size, head_dim):
        if cfg.num_stages > 2:
            cfg = replace(cfg, num_stages=cfg.num_stages - 1)
        elif max(cfg.block_m, cfg.block_n) > 16:
            wide = "block_m" if cfg.block_m >= cfg.block_n else "block_n"
            cfg = replace(cfg, **{wide: getattr(cfg, wide) // 2})
        else:
            break
    return cfg


# Candidate tiles per kernel, timed by `flash-bench --tune` and by phase 11 (the tuned-config tables).
TUNE_CANDIDATES = {
    # Forward: phase 02's best two d = 64 tiles with TMA loads and neighbours; 64 x 64 and 128 x 64
    # at 8 warps are the d = 128 contenders. Tiles that do not fit the GPU are left out.
    "fwd": [
        TileConfig(128, 128, 4, 3), TileConfig(128, 64, 8, 3), TileConfig(128, 64, 4, 3),
        TileConfig(128, 128, 4, 2), TileConfig(128, 128, 8, 3), TileConfig(64, 64, 4, 3),
        TileConfig(64, 64, 4, 2), TileConfig(128, 64, 8, 2), TileConfig(128, 128, 8, 2),
    ],
    "dq": [
        TileConfig(128, 64, 8, 2), TileConfig(128, 64, 4, 3), TileConfig(128, 32, 4, 3),
        TileConfig(64, 64, 4, 3), TileConfig(128, 128, 8, 2), TileConfig(128, 64, 8, 3), TileConfig(64, 64, 8, 3),
    ],
    "dkdv": [
        TileConfig(64, 128, 8, 2), TileConfig(32, 128, 4, 3), TileConfig(64, 128, 4, 3),
        TileConfig(64, 64, 4, 3), TileConfig(128, 128, 8, 2), TileConfig(32, 64, 4, 4),
        TileConfig(32, 64, 4, 3), TileConfig(64, 64, 8, 3),
    ],
}  # fmt: skip


def table_name(kernel: str) -> str:
    """``kernel``'s name in the tuned-config tables (``tritonlab.tuning_tables``)."""
    return f"flash2.{kernel}"


def table_key(dtype: torch.dtype, head_dim: int, causal: bool) -> str:
    """The tables' key of a call: what the code table keys its tiles by, exactly."""
    return f"CAUSAL={bool(causal)},HEAD_DIM={head_dim}|{dtype_name(dtype)}"


def tiles_from_entry(config: dict) -> TileConfig | None:
    """A table entry's config as tiles; None if it does not name two block sizes."""
    kw = config.get("kwargs", {})
    if not all(isinstance(kw.get(name), int) and kw[name] > 0 for name in ("BLOCK_M", "BLOCK_N")):
        return None
    return TileConfig(kw["BLOCK_M"], kw["BLOCK_N"], config["num_warps"], config["num_stages"])


def _tuned_tiles(kernel: str, dtype: torch.dtype, head_dim: int, causal: bool, device) -> TileConfig | None:
    """The tiles of the tuned-config table for this GPU, if it has an entry (and TRITONLAB_AUTOTUNE
    is "table"); a malformed entry is ignored with one warning."""
    gpu = gpu_slug(torch.cuda.get_device_name(device))
    name, key = table_name(kernel), table_key(dtype, head_dim, causal)
    config = TUNER.lookup(name, key, gpu, dtype_name(dtype))
    if config is None:
        return None
    tiles = tiles_from_entry(config)
    if tiles is None:
        TUNER.say_once(
            ("malformed", gpu, name, key), logging.WARNING,
            "%s: the %s table's entry at %s names no BLOCK_M/BLOCK_N; using the code's tiles", name, gpu, key,
        )  # fmt: skip
    return tiles


def tile_config(
    kernel: str, dtype: torch.dtype, head_dim: int, causal: bool = True, device=None
) -> TileConfig:
    """The tiles ``kernel`` ("fwd", "dq" or "dkdv") runs with for these inputs: the tuned-config
    table's for the GPU of ``device`` where it has an entry, else this module's measured table."""
    if INTERPRET:
        return _INTERPRETER_CONFIGS[kernel]
    element_size = torch.finfo(dtype).bits // 8
    tuned = _tuned_tiles(kernel, dtype, head_dim, causal, device) if device is not None else None
    return _fit(tuned or _table_config(kernel, dtype, head_dim, causal), kernel, element_size, head_dim)


# ----------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------


@triton.jit
def _rows_ptr(base, n_rows, stride_row, stride_col, start, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    """A block pointer to (BLOCK, HEAD_DIM) tiles of an (n_rows, HEAD_DIM) matrix, from row ``start``."""
    return tl.make_block_ptr(
        base, (n_rows, HEAD_DIM), (stride_row, stride_col), (start, 0), (BLOCK, HEAD_DIM), (1, 0)
    )


@triton.jit
def _cols_ptr(base, n_rows, stride_row, stride_col, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    """The same matrix read transposed, (HEAD_DIM, BLOCK) tiles from row 0: the K^T of a Q K^T dot."""
    return tl.make_block_ptr(
        base, (HEAD_DIM, n_rows), (stride_col, stride_row), (0, 0), (HEAD_DIM, BLOCK), (0, 1)
    )


@triton.jit
def _key_range(start_m, n_keys, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """(full_n, end_n) for the query tile at start_m: keys [0, end_n) matter; [0, full_n) are whole
    tiles needing no mask (inside the keys and, if causal, below the diagonal)."""
    if CAUSAL:
        end_n = tl.minimum(n_keys, start_m + BLOCK_M)
        full_n = tl.minimum(start_m, n_keys) // BLOCK_N * BLOCK_N
    else:
        end_n = n_keys
        full_n = n_keys // BLOCK_N * BLOCK_N
    return full_n, end_n


@triton.jit
def _fwd_key_loop(
    acc, m_i, l_i, q, k_in, v_in, start_n, end_n, offs_m, qk_scale, n_keys, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Fold key tiles [start_n, end_n) into the running (acc, m, l) of one query tile.

    ``k_in`` and ``v_in`` are tensor descriptors of K and V (USE_TMA) or block pointers to K^T
    and V at key 0. Unmasked tiles lie inside the keys and below the diagonal: no bounds check and
    no tl.where. m is kept in base-2 units (scores times qk_scale), l and acc are unnormalised.
    """
    if not USE_TMA:
        k_in = tl.advance(k_in, (0, start_n))
        v_in = tl.advance(v_in, (start_n, 0))
    for start in range(start_n, end_n, BLOCK_N):
        if USE_TMA:  # the copy engine reads rows past n_keys as zeros: no bounds check to write
            kT = tl.trans(k_in.load([start, 0]))
            v = v_in.load([start, 0])
        elif MASKED:
            kT = tl.load(k_in, boundary_check=(1,), padding_option="zero")
            v = tl.load(v_in, boundary_check=(0,), padding_option="zero")
        else:
            kT = tl.load(k_in)
            v = tl.load(v_in)
        s = tl.dot(q, kT, input_precision=DOT_PRECISION)  # raw: the scale goes into the exp2's FMA
        if MASKED:
            offs_n = start + tl.arange(0, BLOCK_N)
            keep = offs_n[None, :] < n_keys
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            s = tl.where(keep, s, float("-inf"))
        acc, m_i, l_i = online_softmax_tile(acc, m_i, l_i, s, v, qk_scale, DOT_PRECISION)
        if not USE_TMA:
            k_in = tl.advance(k_in, (0, BLOCK_N))
            v_in = tl.advance(v_in, (BLOCK_N, 0))
    return acc, m_i, l_i


@triton.jit
def _fwd_kernel(
    Q, K, V, O, L,
    stride_qb, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd, stride_vb, stride_vn, stride_vd,
    stride_ob, stride_om, stride_od,
    n_queries, n_keys, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    EVEN_M: tl.constexpr, USE_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    # A 1-D grid of num_m query tiles x batch. Programs start roughly in index order, so causal
    # runs the last query tile of every batch (the most keys) first, then the one before, and the
    # last wave holds the short programs; non-causal keeps a batch's tiles together (K, V in L2).
    num_m = tl.cdiv(n_queries, BLOCK_M)
    pid = tl.program_id(0)
    if CAUSAL:
        batch = tl.num_programs(0) // num_m
        b = pid % batch
        pid_m = num_m - 1 - pid // batch
    else:
        b = pid // num_m
        pid_m = pid % num_m
    b = b.to(tl.int64)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)

    if USE_TMA:
        q_desc = tl.make_tensor_descriptor(
            Q + b * stride_qb, [n_queries, HEAD_DIM], [stride_qm, 1], [BLOCK_M, HEAD_DIM]
        )
        k_in = tl.make_tensor_descriptor(
            K + b * stride_kb, [n_keys, HEAD_DIM], [stride_kn, 1], [BLOCK_N, HEAD_DIM]
        )
        v_in = tl.make_tensor_descriptor(
            V + b * stride_vb, [n_keys, HEAD_DIM], [stride_vn, 1], [BLOCK_N, HEAD_DIM]
        )
        q = q_desc.load([start_m, 0])
    else:
        q_ptr = _rows_ptr(Q + b * stride_qb, n_queries, stride_qm, stride_qd, start_m, BLOCK_M, HEAD_DIM)
        # K is read transposed, (D, Nk), so the score tile is a plain Q @ K^T dot.
        k_in = _cols_ptr(K + b * stride_kb, n_keys, stride_kn, stride_kd, BLOCK_N, HEAD_DIM)
        v_in = _rows_ptr(V + b * stride_vb, n_keys, stride_vn, stride_vd, 0, BLOCK_N, HEAD_DIM)
        q = tl.load(q_ptr) if EVEN_M else tl.load(q_ptr, boundary_check=(0,), padding_option="zero")

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # Whole tiles below the diagonal with no mask, then the diagonal or ragged tiles, masked.
    full_n, end_n = _key_range(start_m, n_keys, BLOCK_M, BLOCK_N, CAUSAL)
    acc, m_i, l_i = _fwd_key_loop(acc, m_i, l_i, q, k_in, v_in, 0, full_n, offs_m, qk_scale, n_keys, BLOCK_N,
                                  False, CAUSAL, USE_TMA, DOT_PRECISION)  # fmt: skip
    acc, m_i, l_i = _fwd_key_loop(acc, m_i, l_i, q, k_in, v_in, full_n, end_n, offs_m, qk_scale, n_keys,
                                  BLOCK_N, True, CAUSAL, USE_TMA, DOT_PRECISION)  # fmt: skip

    o = (acc / l_i[:, None]).to(O.dtype.element_ty)
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453  # times ln 2: back to natural log
    if USE_TMA:  # the copy engine drops rows past n_queries
        o_desc = tl.make_tensor_descriptor(
            O + b * stride_ob, [n_queries, HEAD_DIM], [stride_om, 1], [BLOCK_M, HEAD_DIM]
        )
        o_desc.store([start_m, 0], o)
    else:
        o_ptr = _rows_ptr(O + b * stride_ob, n_queries, stride_om, stride_od, start_m, BLOCK_M, HEAD_DIM)
        if EVEN_M:
            tl.store(o_ptr, o)
        else:
            tl.store(o_ptr, o, boundary_check=(0,))
    if EVEN_M:
        tl.store(L + b * n_queries + offs_m, lse)
    else:
        tl.store(L + b * n_queries + offs_m, lse, mask=offs_m < n_queries)


# ----------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------


@triton.jit
def _dkdv_query_loop(
    dk, dv, k, v, qT_ptr, do_ptr, L, Delta, start_m, end_m, offs_n, qk_scale, n_queries,
    BLOCK_M: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Accumulate dK, dV of one key tile over query tiles [start_m, end_m), working on transposes
    (keys along rows) so that dK = dS^T Q and dV = P^T dO need no shuffles of the accumulators."""
    qT_ptr = tl.advance(qT_ptr, (0, start_m))
    do_ptr = tl.advance(do_ptr, (start_m, 0))
    for start in range(start_m, end_m, BLOCK_M):
        offs_m = start + tl.arange(0, BLOCK_M)
        if MASKED:
            qT = tl.load(qT_ptr, boundary_check=(1,), padding_option="zero")
            do = tl.load(do_ptr, boundary_check=(0,), padding_option="zero")
            lse2 = tl.load(L + offs_m, mask=offs_m < n_queries, other=float("inf"))
            delta = tl.load(Delta + offs_m, mask=offs_m < n_queries, other=0.0)
        else:
            qT = tl.load(qT_ptr)
            do = tl.load(do_ptr)
            lse2 = tl.load(L + offs_m)
            delta = tl.load(Delta + offs_m)
        # P^T recomputed from the saved logsumexp (converted to base 2 by the caller's scale).
        pT = tl.math.exp2(
            tl.dot(k, qT, input_precision=DOT_PRECISION) * qk_scale - lse2[None, :] * 1.4426950408889634
        )
        if MASKED:
            keep = offs_m[None, :] < n_queries
            if CAUSAL:
                keep = keep & (offs_m[None, :] >= offs_n[:, None])
            pT = tl.where(keep, pT, 0.0)
        dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        dsT = pT * (dpT - delta[None, :])
        dk = tl.dot(dsT.to(qT.dtype), tl.trans(qT), dk, input_precision=DOT_PRECISION)
        qT_ptr = tl.advance(qT_ptr, (0, BLOCK_M))
        do_ptr = tl.advance(do_ptr, (BLOCK_M, 0))
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DO, L, Delta, DK, DV,
    stride_qb, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd, stride_vb, stride_vn, stride_vd,
    stride_dob, stride_dom, stride_dod,
    n_queries, n_keys, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    EVEN_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    # Causal: the first key tiles are seen by the most queries, and they already start first.
    start_n = tl.program_id(0) * BLOCK_N
    b = tl.program_id(1).to(tl.int64)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k_ptr = _rows_ptr(K + b * stride_kb, n_keys, stride_kn, stride_kd, start_n, BLOCK_N, HEAD_DIM)
    v_ptr = _rows_ptr(V + b * stride_vb, n_keys, stride_vn, stride_vd, start_n, BLOCK_N, HEAD_DIM)
    if EVEN_N:
        k = tl.load(k_ptr)
        v = tl.load(v_ptr)
    else:
        k = tl.load(k_ptr, boundary_check=(0,), padding_option="zero")
        v = tl.load(v_ptr, boundary_check=(0,), padding_option="zero")
    qT_ptr = _cols_ptr(Q + b * stride_qb, n_queries, stride_qm, stride_qd, BLOCK_M, HEAD_DIM)
    do_ptr = _rows_ptr(DO + b * stride_dob, n_queries, stride_dom, stride_dod, 0, BLOCK_M, HEAD_DIM)
    L += b * n_queries
    Delta += b * n_queries
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)

    # Query tiles: [first_m, diag_end) cross the diagonal (causal), [diag_end, full_m) need no mask,
    # [full_m, padded end) is the ragged last tile. Non-causal has no diagonal part.
    full_m = n_queries // BLOCK_M * BLOCK_M
    if CAUSAL:
        first_m = start_n // BLOCK_M * BLOCK_M
        diag_end = tl.cdiv(start_n + BLOCK_N, BLOCK_M) * BLOCK_M
    else:
        first_m = 0
        diag_end = 0
    mid = tl.maximum(first_m, tl.minimum(diag_end, full_m))
    dk, dv = _dkdv_query_loop(dk, dv, k, v, qT_ptr, do_ptr, L, Delta, first_m, mid, offs_n, qk_scale,
                              n_queries, BLOCK_M, True, CAUSAL, DOT_PRECISION)  # fmt: skip
    dk, dv = _dkdv_query_loop(dk, dv, k, v, qT_ptr, do_ptr, L, Delta, mid, full_m, offs_n, qk_scale,
                              n_queries, BLOCK_M, False, CAUSAL, DOT_PRECISION)  # fmt: skip
    dk, dv = _dkdv_query_loop(dk, dv, k, v, qT_ptr, do_ptr, L, Delta, tl.maximum(full_m, first_m),
                              tl.cdiv(n_queries, BLOCK_M) * BLOCK_M, offs_n, qk_scale, n_queries, BLOCK_M,
                              True, CAUSAL, DOT_PRECISION)  # fmt: skip

    # dS is the gradient of the scaled scores; the 1/sqrt(d) of S = Q K^T / sqrt(d) comes in here.
    dk_ptr = _rows_ptr(DK + b * stride_kb, n_keys, stride_kn, stride_kd, start_n, BLOCK_N, HEAD_DIM)
    dv_ptr = _rows_ptr(DV + b * stride_vb, n_keys, stride_vn, stride_vd, start_n, BLOCK_N, HEAD_DIM)
    if EVEN_N:
        tl.store(dk_ptr, (dk * sm_scale).to(DK.dtype.element_ty))
        tl.store(dv_ptr, dv.to(DV.dtype.element_ty))
    else:
        tl.store(dk_ptr, (dk * sm_scale).to(DK.dtype.element_ty), boundary_check=(0,))
        tl.store(dv_ptr, dv.to(DV.dtype.element_ty), boundary_check=(0,))


@triton.jit
def _dq_key_loop(
    dq, q, do, lse2, delta, kT_ptr, vT_ptr, start_n, end_n, offs_m, qk_scale, n_keys, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Accumulate dQ of one query tile over key tiles [start_n, end_n)."""
    kT_ptr = tl.advance(kT_ptr, (0, start_n))
    vT_ptr = tl.advance(vT_ptr, (0, start_n))
    for start in range(start_n, end_n, BLOCK_N):
        # Loads as in the forward's block-pointer path, V read transposed here (dP = dO V^T).
        if MASKED:
            kT = tl.load(kT_ptr, boundary_check=(1,), padding_option="zero")
            vT = tl.load(vT_ptr, boundary_check=(1,), padding_option="zero")
        else:
            kT = tl.load(kT_ptr)
            vT = tl.load(vT_ptr)
        p = tl.math.exp2(tl.dot(q, kT, input_precision=DOT_PRECISION) * qk_scale - lse2[:, None])
        if MASKED:
            offs_n = start + tl.arange(0, BLOCK_N)
            keep = offs_n[None, :] < n_keys
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, vT, input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(kT.dtype), tl.trans(kT), dq, input_precision=DOT_PRECISION)
        kT_ptr = tl.advance(kT_ptr, (0, BLOCK_N))
        vT_ptr = tl.advance(vT_ptr, (0, BLOCK_N))
    return dq


@triton.jit
def _bwd_dq_kernel(
    # _bwd_dkdv_kernel's arguments with DQ for DK and DV: flash_backward's common_args feed both.
    Q, K, V, DO, L, Delta, DQ,
    stride_qb, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd, stride_vb, stride_vn, stride_vd,
    stride_dob, stride_dom, stride_dod,
    n_queries, n_keys, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    EVEN_M: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    num_m = tl.num_programs(0)
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = num_m - 1 - pid_m
    b = tl.program_id(1).to(tl.int64)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    # Q and dO as the dK/dV kernel loads K and V (same shape of code, other tensors and EVEN flag).
    q_ptr = _rows_ptr(Q + b * stride_qb, n_queries, stride_qm, stride_qd, start_m, BLOCK_M, HEAD_DIM)
    do_ptr = _rows_ptr(DO + b * stride_dob, n_queries, stride_dom, stride_dod, start_m, BLOCK_M, HEAD_DIM)
    if EVEN_M:
        q = tl.load(q_ptr)
        do = tl.load(do_ptr)
        lse2 = tl.load(L + b * n_queries + offs_m) * 1.4426950408889634
        delta = tl.load(Delta + b * n_queries + offs_m)
    else:
        q = tl.load(q_ptr, boundary_check=(0,), padding_option="zero")
        do = tl.load(do_ptr, boundary_check=(0,), padding_option="zero")
        lse2 = tl.load(L + b * n_queries + offs_m, mask=offs_m < n_queries, other=0.0) * 1.4426950408889634
        delta = tl.load(Delta + b * n_queries + offs_m, mask=offs_m < n_queries, other=0.0)
    kT_ptr = _cols_ptr(K + b * stride_kb, n_keys, stride_kn, stride_kd, BLOCK_N, HEAD_DIM)
    vT_ptr = _cols_ptr(V + b * stride_vb, n_keys, stride_vn, stride_vd, BLOCK_N, HEAD_DIM)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    full_n, end_n = _key_range(start_m, n_keys, BLOCK_M, BLOCK_N, CAUSAL)
    dq = _dq_key_loop(dq, q, do, lse2, delta, kT_ptr, vT_ptr, 0, full_n, offs_m, qk_scale, n_keys, BLOCK_N,
                      False, CAUSAL, DOT_PRECISION)  # fmt: skip
    dq = _dq_key_loop(dq, q, do, lse2, delta, kT_ptr, vT_ptr, full_n, end_n, offs_m, qk_scale, n_keys,
                      BLOCK_N, True, CAUSAL, DOT_PRECISION)  # fmt: skip
    dq_ptr = _rows_ptr(DQ + b * stride_qb, n_queries, stride_qm, stride_qd, start_m, BLOCK_M, HEAD_DIM)
    if EVEN_M:
        tl.store(dq_ptr, (dq * sm_scale).to(DQ.dtype.element_ty))
    else:
        tl.store(dq_ptr, (dq * sm_scale).to(DQ.dtype.element_ty), boundary_check=(0,))


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------


def _uses_gluon(q, k, v, impl: str) -> bool:
    """Whether the forward runs ``forward_hopper``'s Gluon kernel: asked for ("gluon": an error
    naming why where it cannot run), or "auto" where it can -- Hopper, 16-bit, D 64 or 128,
    TMA-addressable strides -- from GLUON_FROM_N keys on. The backward's dK/dV follows where
    ``backward_hopper`` has a config."""
    check_choice("impl", impl, IMPLS)
    if impl == "triton":
        return False
    reason = forward_hopper.unsupported_reason(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1))
    if impl == "gluon" and reason is not None:
        raise ValueError(f"impl: 'gluon' needs {reason}")
    return reason is None and (impl == "gluon" or k.shape[1] >= GLUON_FROM_N)


def flash_forward(
    q, k, v, is_causal: bool, config: TileConfig | None = None, loader: str = "auto", impl: str = "auto"
):
    """O (like q) and L (B, Nq) in fp32. ``impl`` picks the kernel: "gluon" (``forward_hopper``),
    "triton", or "auto" -- Gluon where it can run, unless ``config`` or ``loader`` asks for the Triton
    kernel's tiles or loads. ``config`` overrides the Triton tile table (the tuner's candidates);
    ``loader`` picks its loads: "tma" (tensor descriptors), "blockptr", or "auto" -- TMA whenever the
    strides allow it."""
    check_qkv(q, k, v, ndim=3, dtypes=TRITON_DTYPES, head_dims=HEAD_DIMS)
    check_choice("loader", loader, LOADERS)
    batch, n_q, head_dim = q.shape
    n_k = k.shape[1]
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(batch, n_q, dtype=torch.float32, device=q.device)
    sm_scale = 1.0 / math.sqrt(head_dim)
    pinned = config is not None or loader != "auto"
    if _uses_gluon(q, k, v, "triton" if pinned and impl == "auto" else impl):
        heads = (t.unsqueeze(1) for t in (q, k, v, o))  # one head: (B, 1, N, D)
        forward_hopper.forward(*heads, lse, sm_scale * LOG2E, causal=is_causal)
        return o, lse
    cfg = config or tile_config("fwd", q.dtype, head_dim, is_causal, q.device)
    use_tma = loader != "blockptr" and tma_ok(q, k, v, o)
    if loader == "tma" and not use_tma:
        raise ValueError("loader: 'tma' needs unit stride along D and 16-byte aligned rows in q, k and v")
    use_descriptor_scratch()
    grid = (cdiv(n_q, cfg.block_m) * batch,)
    _fwd_kernel[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(), n_q, n_k, sm_scale * LOG2E,
        HEAD_DIM=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=is_causal,
        EVEN_M=n_q % cfg.block_m == 0, USE_TMA=use_tma, DOT_PRECISION=dot_precision(q.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return o, lse


def _gluon_dkdv(q, k, v, lse, grad_o, delta, sm_scale: float, is_causal: bool, dq_sum=None):
    """dK and dV from ``backward_hopper``'s kernel, the (B, N, D) inputs seen as one head; with
    ``dq_sum`` (B, 1, Nq, D) float32 zeros, dQ is added into it too (the fused backward)."""
    batch, n_k, head_dim = k.shape
    grads = torch.empty((2, batch, 1, n_k, head_dim), dtype=k.dtype, device=k.device)
    heads = (t.unsqueeze(1) for t in (q, k, v, lse, grad_o, delta))
    backward_hopper.dkdv(*heads, grads, sm_scale, causal=is_causal, dq=dq_sum)
    return grads[0, :, 0], grads[1, :, 0]


def flash_backward(
    q, k, v, o, lse, grad_o, is_causal: bool, dq_config: TileConfig | None = None,
    dkdv_config: TileConfig | None = None, impl: str = "auto", deterministic: bool = False,
):  # fmt: skip
    """dQ, dK, dV from the saved O and L: Δ first, then the dK/dV and the dQ kernels. ``impl`` as
    ``flash_forward``'s: with Gluon the dK/dV kernel is ``backward_hopper``'s where it has a config
    for D (``backward_hopper.CONFIGS``) and dO is TMA-addressable (a ``dkdv_config`` pins the Triton
    one under "auto"), and where it has a fused config (``backward_hopper.FUSED_CONFIGS``: D = 64)
    unless ``deterministic`` (or a ``dq_config`` is given) it computes dQ too, summed in float32 by
    TMA reductions in no fixed order (the fused backward); otherwise dQ is the Triton kernel's,
    deterministic."""
    batch, n_q, head_dim = q.shape
    n_k = k.shape[1]
    sm_scale = 1.0 / math.sqrt(head_dim)
    precision = dot_precision(q.dtype)
    # dQ, dK, dV are written with Q's, K's and V's strides: make those the contiguous ones (a no-op
    # for the usual contiguous inputs).
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    gluon = _uses_gluon(q, k, v, "triton" if dkdv_config is not None and impl == "auto" else impl)
    gluon = gluon and head_dim in backward_hopper.CONFIGS and tma_ok(grad_o)
    if gluon and head_dim in backward_hopper.FUSED_CONFIGS and not deterministic and dq_config is None:
        dq_sum = torch.empty((batch, 1, n_q, head_dim), dtype=torch.float32, device=q.device)
        delta = backward_delta(o, grad_o, zero=dq_sum)  # zeroes dQ's sum in the same launch
        dk, dv = _gluon_dkdv(q, k, v, lse, grad_o, delta, sm_scale, is_causal, dq_sum)
        return dq_sum[:, 0].to(q.dtype), dk, dv
    delta = backward_delta(o, grad_o)
    dq_cfg = dq_config or tile_config("dq", q.dtype, head_dim, is_causal, q.device)
    dq = torch.empty_like(q)
    common_args = (
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *grad_o.stride(),
        n_q,
        n_k,
        sm_scale * LOG2E,
        sm_scale,
    )
    # dQ first: the GPU runs it while the host builds the Gluon kernel's descriptors.
    _bwd_dq_kernel[(cdiv(n_q, dq_cfg.block_m), batch)](
        q, k, v, grad_o, lse, delta, dq, *common_args,
        HEAD_DIM=head_dim, BLOCK_M=dq_cfg.block_m, BLOCK_N=dq_cfg.block_n, CAUSAL=is_causal,
        EVEN_M=n_q % dq_cfg.block_m == 0, DOT_PRECISION=precision,
        num_warps=dq_cfg.num_warps, num_stages=dq_cfg.num_stages,
    )  # fmt: skip
    if gluon:
        dk, dv = _gluon_dkdv(q, k, v, lse, grad_o, delta, sm_scale, is_causal)
    else:
        # (looked up only here: the Gluon path has no use for the Triton kernel's tiles)
        dkdv_cfg = dkdv_config or tile_config("dkdv", q.dtype, head_dim, is_causal, q.device)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        _bwd_dkdv_kernel[(cdiv(n_k, dkdv_cfg.block_n), batch)](
            q, k, v, grad_o, lse, delta, dk, dv, *common_args,
            HEAD_DIM=head_dim, BLOCK_M=dkdv_cfg.block_m, BLOCK_N=dkdv_cfg.block_n, CAUSAL=is_causal,
            EVEN_N=n_k % dkdv_cfg.block_n == 0, DOT_PRECISION=precision,
            num_warps=dkdv_cfg.num_warps, num_stages=dkdv_cfg.num_stages,
        )  # fmt: skip
    return dq, dk, dv


class FlashAttentionTriton(torch.autograd.Function):
    """``FlashAttentionTriton.apply(q, k, v, is_causal=False)`` with q (B, Nq, D), k and v (B, Nk, D),
    fp16 / bf16 / fp32 (fp32 dots in IEEE float32 unless ``torch.set_float32_matmul_precision``
    allows TF32), D in 16, 32, 64, 128, any Nq and Nk >= 1, any strides.

    Saves Q, K, V, O and L (B, Nq) for a backward that runs in Triton too. ``impl`` ("auto",
    "triton", "gluon"): the forward and dK/dV kernels, as ``flash_forward`` takes it;
    ``deterministic``: dQ by the separate Triton pass where the Gluon backward would sum it with
    reductions in no fixed order (``flash_backward``).
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, impl="auto", deterministic=False):
        o, lse = flash_forward(q, k, v, bool(is_causal), impl=impl)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal = bool(is_causal)
        ctx.impl = impl
        ctx.deterministic = bool(deterministic)
        return o

    @staticmethod
    def backward(ctx, grad_o):
        q, k, v, o, lse = ctx.saved_tensors
        grad_o, det = grad_o.contiguous(), ctx.deterministic
        dq, dk, dv = flash_backward(q, k, v, o, lse, grad_o, ctx.is_causal, impl=ctx.impl, deterministic=det)
        return dq, dk, dv, None, None, None


__all__ = [
    "IMPLS",
    "LOADERS",
    "TUNE_CANDIDATES",
    "FlashAttentionTriton",
    "TileConfig",
    "flash_backward",
    "flash_forward",
    "tile_config",
]
