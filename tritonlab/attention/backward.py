"""Differentiable rectangular attention with a two-pass backward: Δ, then dK/dV by key block, then
dQ by query block. Deterministic: no atomics, the same inputs give the same bits. On Hopper, where
the Gluon forward runs, the dK/dV pass is ``backward_hopper``'s Gluon kernel.

With S = scale·QKᵀ, P = softmax(S) and the forward's logsumexp saved, P is recomputed tile by tile
as exp(S − lse) instead of being stored (the Lq x Lk matrix never exists). The gradients are

    dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP − Δ)  with  Δ = rowsum(dO ∘ O),
    dK = scale · dSᵀ Q,   dQ = scale · dS K.

Four launches:
  1. ``_common.backward_delta``: Δ per query row (one read of O and dO; shared with flash2).
  2. ``_dkdv_kernel``: a program owns one K/V block and loops over the query tiles of one *chunk*
     of rows, accumulating its dK and dV in registers (working transposed). When few (batch, head,
     key block) programs exist -- short K, one head -- the query rows are split into chunks so
     every SM gets work; each chunk then writes an fp32 partial ...
  3. ``_reduce_chunks_kernel``: ... which this sums in a fixed order (skipped with one chunk).
  4. ``_dq_kernel``: a program owns one query block and loops over every K/V block.
Query rows past Lq carry lse = +inf, so their P is exactly 0 with no mask in the steady state.

The tile functions ``_dkdv_tile``, ``_dq_row_block`` and the chunk plumbing are shared with the
fused backward (``fused.py``). The FlashAttention-2 backward (``flash2.py``) computes the same two
passes for 3-D causal inputs; its loops stay separate because the causal diagonal splits them into
masked and unmasked ranges whose bounds differ per tile, which these loops do not have.

**torch.compile.** Dynamo cannot trace the launches (autotuners, direct launches of cached
binaries, Triton's allocator), so while it traces, ``attention`` calls the custom op
``tritonlab::attention_forward`` -- (o, lse), with a fake implementation giving their shapes and
strides -- whose registered autograd formula calls ``tritonlab::attention_backward``: opaque nodes
in the graph, running the same host code and kernels as the eager route. Eager calls keep the
plain autograd function, which skips the custom-op dispatcher's host time per call (it shows next
to 0.1 ms kernels). ``record`` cannot cross a custom op: passing one while compiling is an error.
"""

import torch
import triton
import triton.language as tl

from .._launch import LaunchCache, autotune_for_launch, first_launch, launch, signature_key, tma_ok
from .._runtime import INTERPRET, cdiv
from ..tuning import ConfigRecord, dot_precision, quiet_compile_failures, refuse_record_under_compile
from ..tuning_tables import autotune
from . import backward_hopper
from ._common import (
    LOG2E,
    backward_delta,
    check_kv,
    check_qkv,
    config_string,
    fits,
    load_rows,
    shape_bucket,
    small_tiles_only,
    smallest,
    softmax_scale,
    store_rows,
    strides4,
    tuning_bench,
)
from .forward import _checked_forward, _forward_outputs
from .forward import _uses_gluon as _forward_uses_gluon

_SM_TARGET = 264  # programs to aim for: two waves of an H100's 132 SMs
_CHUNK_ALIGN = 128  # query chunks are whole multiples of every BLOCK_M in the search spaces


# --- tile maths, shared with the fused backward --------------------------------------------------


@triton.jit
def _dkdv_tile(dk, dv, k, v, q, do, lse2, delta, qk_scale, DOT_PRECISION: tl.constexpr):
    """Add one query tile's share to a key block's dK (unscaled) and dV, working transposed.

    lse2 is the logsumexp in base 2 (``lse·log2 e``); rows of padding carry lse2 = +inf, so
    their recomputed probabilities are exactly zero. Also returns dSᵀ of the tile, from which a
    caller that sees every key (the fused backward, one key block) takes dQ for free.
    """
    p_t = tl.math.exp2(tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale - lse2[None, :])
    dv += tl.dot(p_t.to(do.dtype), do, input_precision=DOT_PRECISION)
    dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
    ds_t = p_t * (dp_t - delta[None, :])
    dk += tl.dot(ds_t.to(q.dtype), q, input_precision=DOT_PRECISION)
    return dk, dv, ds_t


@triton.jit
def _dq_tile(
    dq, q, do, lse2, delta, k, v, qk_scale, col_start, Lk,
    MASK_COLS: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Add one key tile's share to a query block's dQ (unscaled); only the tail tile is masked."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale - lse2[:, None]
    if MASK_COLS:
        cols = col_start + tl.arange(0, BLOCK_N)
        s = tl.where((cols < Lk)[None, :], s, float("-inf"))
    p = tl.math.exp2(s)
    dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
    ds = p * (dp - delta[:, None])
    dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _query_chunk(pid_c, q_chunk, Lq, BLOCK_M: tl.constexpr):
    """Query rows [row_begin, row_end) of chunk ``pid_c``; the tiles from row_begin to full_end are whole."""
    row_begin = pid_c * q_chunk
    row_end = tl.minimum(row_begin + q_chunk, Lq)
    full_end = row_begin + (row_end - row_begin) // BLOCK_M * BLOCK_M
    return row_begin, row_end, full_end


@triton.jit
def _load_row_values(ptr, rows, Lq, padding: tl.constexpr, CHECK: tl.constexpr):
    """One value per query row (lse or Δ); with CHECK, rows past Lq read as ``padding``."""
    if CHECK:
        return tl.load(ptr + rows, mask=rows < Lq, other=padding)
    return tl.load(ptr + rows)


@triton.jit
def _load_lse2(LSE, bh_offset, row_start, Lq, BLOCK_M: tl.constexpr, CHECK: tl.constexpr):
    """lse in base 2 for a query tile; padding rows get +inf, so their P = exp2(s - lse2) is 0."""
    rows = row_start + tl.arange(0, BLOCK_M)
    return _load_row_values(LSE + bh_offset, rows, Lq, float("inf"), CHECK) * 1.4426950408889634


@triton.jit
def _load_row_stats(LSE, DELTA, bh_offset, row_start, Lq, BLOCK_M: tl.constexpr, CHECK: tl.constexpr):
    """lse in base 2 and Δ for a query tile; padding rows get lse2 = +inf (so P = 0) and Δ = 0."""
    rows = row_start + tl.arange(0, BLOCK_M)
    delta = _load_row_values(DELTA + bh_offset, rows, Lq, 0.0, CHECK)
    return _load_lse2(LSE, bh_offset, row_start, Lq, BLOCK_M, CHECK), delta


@triton.jit
def _store_key_block(
    DK, DV, dk, dv, chunk, b, h, col_start, Lk,
    stride_c, stride_b, stride_h, stride_l, stride_d,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """Write a key block's dK, dV: into the gradients, or into chunk ``chunk`` of the partials."""
    offset = chunk.to(tl.int64) * stride_c + b * stride_b + h * stride_h
    dk_ptr = tl.make_block_ptr(
        DK + offset, (Lk, HEAD_DIM), (stride_l, stride_d), (col_start, 0), (BLOCK_N, HEAD_DIM), (1, 0)
    )
    tl.store(dk_ptr, dk.to(DK.dtype.element_ty), boundary_check=(0,))
    dv_ptr = tl.make_block_ptr(
        DV + offset, (Lk, HEAD_DIM), (stride_l, stride_d), (col_start, 0), (BLOCK_N, HEAD_DIM), (1, 0)
    )
    tl.store(dv_ptr, dv.to(DV.dtype.element_ty), boundary_check=(0,))


@triton.jit
def _dq_row_block(
    q, do, lse2, delta, k_base, v_base, stride_kl, stride_kd, stride_vl, stride_vd, Lk, qk_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """A query block's dQ (unscaled) over every key block: full tiles unmasked, then the tail."""
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    n_full = Lk // BLOCK_N
    for j in range(n_full):
        k = load_rows(k_base, stride_kl, stride_kd, j * BLOCK_N, Lk, BLOCK_N, HEAD_DIM, False)
        v = load_rows(v_base, stride_vl, stride_vd, j * BLOCK_N, Lk, BLOCK_N, HEAD_DIM, False)
        dq = _dq_tile(dq, q, do, lse2, delta, k, v, qk_scale, j * BLOCK_N, Lk, False, BLOCK_N, DOT_PRECISION)
    if n_full * BLOCK_N < Lk:
        k = load_rows(k_base, stride_kl, stride_kd, n_full * BLOCK_N, Lk, BLOCK_N, HEAD_DIM, True)
        v = load_rows(v_base, stride_vl, stride_vd, n_full * BLOCK_N, Lk, BLOCK_N, HEAD_DIM, True)
        dq = _dq_tile(
            dq, q, do, lse2, delta, k, v, qk_scale, n_full * BLOCK_N, Lk, True, BLOCK_N, DOT_PRECISION
        )
    return dq


# --- 2. dK, dV: a program per (key block, query chunk, batch·head) -------------------------------


@triton.jit
def _dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, scale, qk_scale,
    stride_qb, stride_qh, stride_ql, stride_qd,
    stride_kb, stride_kh, stride_kl, stride_kd,
    stride_vb, stride_vh, stride_vl, stride_vd,
    stride_gb, stride_gh, stride_gl, stride_gd,
    stride_dkc, stride_dkb, stride_dkh, stride_dkl, stride_dkd,  # DK and DV share a layout
    H, Lq, Lk, q_chunk,
    LQ_BUCKET, LK_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    pid_n, pid_c, pid_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)
    col_start = pid_n * BLOCK_N
    k = load_rows(
        K + b * stride_kb + h * stride_kh, stride_kl, stride_kd, col_start, Lk, BLOCK_N, HEAD_DIM, True
    )
    v = load_rows(
        V + b * stride_vb + h * stride_vh, stride_vl, stride_vd, col_start, Lk, BLOCK_N, HEAD_DIM, True
    )
    q_base = Q + b * stride_qb + h * stride_qh
    do_base = DO + b * stride_gb + h * stride_gh
    bh_offset = pid_bh.to(tl.int64) * Lq
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)

    row_begin, row_end, full_end = _query_chunk(pid_c, q_chunk, Lq, BLOCK_M)
    for row in range(row_begin, full_end, BLOCK_M):  # full query tiles: no checks
        q = load_rows(q_base, stride_ql, stride_qd, row, Lq, BLOCK_M, HEAD_DIM, False)
        do = load_rows(do_base, stride_gl, stride_gd, row, Lq, BLOCK_M, HEAD_DIM, False)
        lse2, delta = _load_row_stats(LSE, DELTA, bh_offset, row, Lq, BLOCK_M, False)
        dk, dv, _ = _dkdv_tile(dk, dv, k, v, q, do, lse2, delta, qk_scale, DOT_PRECISION)
    if full_end < row_end:  # the partial last query tile of the last chunk
        q = load_rows(q_base, stride_ql, stride_qd, full_end, Lq, BLOCK_M, HEAD_DIM, True)
        do = load_rows(do_base, stride_gl, stride_gd, full_end, Lq, BLOCK_M, HEAD_DIM, True)
        lse2, delta = _load_row_stats(LSE, DELTA, bh_offset, full_end, Lq, BLOCK_M, True)
        dk, dv, _ = _dkdv_tile(dk, dv, k, v, q, do, lse2, delta, qk_scale, DOT_PRECISION)

    _store_key_block(DK, DV, dk * scale, dv, pid_c, b, h, col_start, Lk, stride_dkc, stride_dkb, stride_dkh,
                     stride_dkl, stride_dkd, BLOCK_N, HEAD_DIM)  # fmt: skip


# --- 3. the chunks' partials, summed in a fixed order --------------------------------------------


@triton.jit
def _reduce_chunks_kernel(
    P, OUT, n_chunks, n_rows, H, Lk, stride_oc, stride_ob, stride_oh, stride_ol,
    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    # P is contiguous (n_chunks, 2, B, H, Lk, D) fp32 -- dK then dV -- and OUT (2, ...) are the
    # gradients, addressed through their strides (OUT's first stride jumps from dK to dV).
    pid = tl.program_id(0)
    rows = pid * BLOCK + tl.arange(0, BLOCK)  # rows of the flattened (2, B, H, Lk)
    cols = tl.arange(0, HEAD_DIM)
    mask = (rows < n_rows)[:, None]
    acc = tl.zeros([BLOCK, HEAD_DIM], tl.float32)
    ptr = P + rows.to(tl.int64)[:, None] * HEAD_DIM + cols[None, :]
    for _ in range(n_chunks):
        acc += tl.load(ptr, mask=mask, other=0.0)
        ptr += n_rows * HEAD_DIM
    which = rows // (n_rows // 2)
    r = rows % (n_rows // 2)
    l = (r % Lk).to(tl.int64)
    bh = r // Lk
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    out = OUT + which.to(tl.int64) * stride_oc + b * stride_ob + h * stride_oh + l * stride_ol
    tl.store(out[:, None] + cols[None, :], acc.to(OUT.dtype.element_ty), mask=mask)


# --- 4. dQ: a program per (query block, batch·head) ----------------------------------------------


@triton.jit
def _dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, scale, qk_scale,
    stride_qb, stride_qh, stride_ql, stride_qd,
    stride_kb, stride_kh, stride_kl, stride_kd,
    stride_vb, stride_vh, stride_vl, stride_vd,
    stride_gb, stride_gh, stride_gl, stride_gd,
    stride_db, stride_dh, stride_dl, stride_dd,
    H, Lq, Lk,
    LQ_BUCKET, LK_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    b, h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)
    # The dK/dV kernel's opening with the roles swapped: this program owns Q, dO rows, not K, V.
    row_start = pid_m * BLOCK_M
    q = load_rows(
        Q + b * stride_qb + h * stride_qh, stride_ql, stride_qd, row_start, Lq, BLOCK_M, HEAD_DIM, True
    )
    do = load_rows(
        DO + b * stride_gb + h * stride_gh, stride_gl, stride_gd, row_start, Lq, BLOCK_M, HEAD_DIM, True
    )
    lse2, delta = _load_row_stats(LSE, DELTA, pid_bh.to(tl.int64) * Lq, row_start, Lq, BLOCK_M, True)
    dq = _dq_row_block(q, do, lse2, delta, K + b * stride_kb + h * stride_kh, V + b * stride_vb + h * stride_vh,
                       stride_kl, stride_kd, stride_vl, stride_vd, Lk, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM,
                       DOT_PRECISION)  # fmt: skip
    store_rows(
        DQ + b * stride_db + h * stride_dh, stride_dl, stride_dd, row_start, Lq, dq * scale, BLOCK_M, HEAD_DIM
    )


# --- autotuning ----------------------------------------------------------------------------------

# (BLOCK_M, BLOCK_N, num_warps, num_stages) for each kernel; the last, small tile of each is only a
# fallback (fp32 at D = 128), kept out of the tuning wherever a larger one fits.
_DKDV_SPACE = [
    (64, 128, 8, 3),
    (64, 128, 4, 3),
    (32, 128, 4, 3),
    (64, 64, 4, 3),
    (128, 128, 8, 2),
    (32, 64, 4, 2),
]
_DQ_SPACE = [  # (rows alike by shape: a table, not code)
    (128, 64, 8, 3),
    (128, 64, 4, 3),
    (128, 32, 4, 3),
    (64, 64, 4, 3),
    (128, 128, 8, 2),
    (64, 32, 4, 2),
]
_INTERPRETER_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 16}


def _configs(space) -> list:
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s) for bm, bn, w, s in space
    ]


def _prune_by(fixed: str, streamed: str):
    """A prune for a loop that keeps two ``fixed`` tiles (K and V, or Q and dO) and streams two
    ``streamed`` tiles per stage: tiles that fit shared memory, and no larger than 64 x 64 where
    ``small_tiles_only`` says so."""

    def prune(configs, named_args, **kwargs):
        elem, d = named_args["Q"].element_size(), kwargs.get("HEAD_DIM", 64)
        big = small_tiles_only(elem, d)

        def ok(c):
            bm, bn = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
            rows = {"BLOCK_M": bm, "BLOCK_N": bn}
            return not (big and bm * bn > 64 * 64) and fits(
                elem, d, fixed_rows=2 * rows[fixed], streamed_rows=2 * rows[streamed], stages=c.num_stages
            )

        fitting = [c for c in configs if ok(c)]
        kept = [c for c in fitting if c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] >= 64 * 64]
        return kept or smallest(fitting or configs, "BLOCK_M", "BLOCK_N")

    return prune


_TUNING_KEY = ["LQ_BUCKET", "LK_BUCKET", "HEAD_DIM"]
_dkdv_autotuned = autotune(
    _configs(_DKDV_SPACE), name="attention.dkdv", phase="03_attn_bwd", key=_TUNING_KEY, dtype_arg="Q",
    prune_configs_by={"early_config_prune": _prune_by("BLOCK_N", "BLOCK_M")}, do_bench=tuning_bench,
)(_dkdv_kernel)  # fmt: skip
_dq_autotuned = autotune(
    _configs(_DQ_SPACE), name="attention.dq", phase="03_attn_bwd", key=_TUNING_KEY, dtype_arg="Q",
    prune_configs_by={"early_config_prune": _prune_by("BLOCK_M", "BLOCK_N")}, do_bench=tuning_bench,
)(_dq_kernel)  # fmt: skip


def _tune(tensors, autotuner, grid, shape_args, meta, name: str):
    with quiet_compile_failures(name):
        return autotune_for_launch(tensors, autotuner, grid, shape_args, meta)


# Per kernel and call signature (shapes, strides, dtypes and alignment of q, k, v, dO; the dot
# precision): the compiled kernel the autotuner chose, launched directly on later calls. Every other
# argument is a buffer of ours whose layout follows from those shapes, or an integer derived from
# them; the scales travel with the tensors, so a new scale needs no new entry.
_LAUNCHES = LaunchCache(_tune)


# --- the host side -------------------------------------------------------------------------------


def _plan_query_chunks(Lq: int, Lk: int, n_bh: int) -> int:
    """Rows per query chunk of the dK/dV programs: all of Lq unless that leaves SMs idle.

    A chunk is a whole number of query tiles (its last tile is only checked against Lq), so
    chunks are multiples of the largest BLOCK_M -- of the interpreter's one BLOCK_M on the CPU,
    where tiny test shapes then get several chunks and exercise the reduction.
    """
    align = _INTERPRETER_CONFIG["BLOCK_M"] if INTERPRET else _CHUNK_ALIGN
    key_blocks = cdiv(Lk, _CHUNK_ALIGN)
    n_chunks = max(1, min(cdiv(_SM_TARGET, key_blocks * n_bh), cdiv(Lq, align)))
    return cdiv(cdiv(Lq, n_chunks), align) * align


def _like_q_layout(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An empty (B, H, L, D) gradient stored as (B, L, H, D), the layout the model's views come from;
    in ``dtype`` (t's by default)."""
    B, H, L, D = t.shape
    return torch.empty((B, L, H, D), dtype=dtype or t.dtype, device=t.device).transpose(1, 2)


def _key_grad_buffers(k: torch.Tensor, n_chunks: int):
    """dK and dV (2, B, H, Lk, D), and -- with several query chunks -- the fp32 partials the dK/dV
    kernel writes. They are stored as the model's packed K/V projection, (B, Lk, 2, H, D), so the
    packed op's gradient (``_packed``) is this very buffer."""
    B, H, Lk, D = k.shape
    grads = torch.empty((B, Lk, 2, H, D), dtype=k.dtype, device=k.device).permute(2, 0, 3, 1, 4)
    if n_chunks == 1:
        return grads, grads.unsqueeze(0)  # one chunk: the kernel writes the gradients themselves
    partials = torch.empty((n_chunks, 2, B, H, Lk, D), dtype=torch.float32, device=k.device)
    return grads, partials


def _split_kv(kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v (B, H, Lk, D), views of a packed (B, Lk, 2, H, D) K/V projection."""
    return kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)


def _packed(grads: torch.Tensor) -> torch.Tensor:
    """The (B, Lk, 2, H, D) gradient of a packed K/V from ``_key_grad_buffers``' dK and dV: a view."""
    return grads.permute(1, 3, 0, 2, 4)


def _reduce_key_grads(partials: torch.Tensor, grads: torch.Tensor) -> None:
    """Sum the chunk partials into dK, dV (no-op with one chunk: the kernel wrote them directly)."""
    if partials.data_ptr() == grads.data_ptr():
        return
    n_chunks, _, B, H, Lk, D = partials.shape
    n_rows = 2 * B * H * Lk
    block = 32 if INTERPRET else 64
    launch(
        _REDUCE_LAUNCHES, _reduce_chunks_kernel, (cdiv(n_rows, block),), (partials, grads),
        (n_chunks, n_rows, H, Lk, *grads.stride()[:4]), {"HEAD_DIM": D, "BLOCK": block},
    )  # fmt: skip


_REDUCE_LAUNCHES = LaunchCache(first_launch)  # the chunk reduction's direct launches


def _partial_strides(partials: torch.Tensor) -> tuple:
    """(chunk, b, h, l, d) strides of dK inside the (chunks, 2, B, H, Lk, D) partials."""
    s = partials.stride()
    return (s[0], s[2], s[3], s[4], s[5])


def _uses_gluon(q, k, v, do) -> bool:
    """Whether the dK/dV pass runs ``backward_hopper``'s Gluon kernel: where the Gluon forward runs by
    default, at a D it has a config for, with a dO a TMA descriptor can address. The dQ pass stays
    the Triton kernel (a Gluon one measured 2.22 against 2.05 ms at mid)."""
    return q.shape[-1] in backward_hopper.CONFIGS and tma_ok(do) and _forward_uses_gluon(q, k, v, "auto")


def _two_pass_backward(q, k, v, o, lse, do, scale: float, record: ConfigRecord | None = None):
    """dQ and (dK, dV) stacked in one (2, B, H, Lk, D) tensor, from the saved forward (o, lse) and
    the output gradient ``do``."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    qk_scale = scale * LOG2E
    precision = dot_precision(q.dtype)
    delta = backward_delta(o, do)
    gluon = _uses_gluon(q, k, v, do)  # the Gluon dK/dV kernel

    # The Gluon dK/dV kernel runs one chunk: every key block sees every query row.
    q_chunk = Lq if gluon else _plan_query_chunks(Lq, Lk, B * H)
    n_chunks = cdiv(Lq, q_chunk)
    grads, partials = _key_grad_buffers(k, n_chunks)
    dq = _like_q_layout(q)
    buckets = (shape_bucket(Lq), shape_bucket(Lk))
    common_strides = (*strides4(q), *strides4(k), *strides4(v), *strides4(do))
    dkdv_tensors = (q, k, v, do, lse, delta, partials[:, 0], partials[:, 1], scale, qk_scale)
    dkdv_shape = (*common_strides, *_partial_strides(partials), H, Lq, Lk, q_chunk, *buckets)
    dq_tensors = (q, k, v, do, lse, delta, dq, scale, qk_scale)
    dq_shape = (*common_strides, *strides4(dq), H, Lq, Lk, *buckets)
    meta = {"HEAD_DIM": D, "DOT_PRECISION": precision}

    def dkdv_grid(c):
        return (cdiv(Lk, c["BLOCK_N"]), n_chunks, B * H)

    def dq_grid(c):
        return (cdiv(Lq, c["BLOCK_M"]), B * H)

    if not INTERPRET:
        signature = (signature_key(q, k, v, do), precision)
        if gluon:
            backward_hopper.dkdv(q, k, v, lse, do, delta, grads, scale)
        else:
            dkdv_config = _LAUNCHES.launch(
                (_dkdv_kernel, signature),
                dkdv_tensors,
                _dkdv_autotuned,
                dkdv_grid,
                dkdv_shape,
                meta,
                "attention dK/dV",
            )
        dq_config = _LAUNCHES.launch(
            (_dq_kernel, signature), dq_tensors, _dq_autotuned, dq_grid, dq_shape, meta, "attention dQ"
        )
    else:
        cfg = _INTERPRETER_CONFIG
        _dkdv_kernel[dkdv_grid(cfg)](*dkdv_tensors, *dkdv_shape, **meta, **cfg)
        _dq_kernel[dq_grid(cfg)](*dq_tensors, *dq_shape, **meta, **cfg)
        dkdv_config = dq_config = None
    _reduce_key_grads(partials, grads)
    if record is not None:
        dkdv_note = (
            backward_hopper.config_string(D) if gluon else config_string(dkdv_config, _INTERPRETER_CONFIG)
        )
        record.note("dkdv", dkdv_note)
        record.note("dq", config_string(dq_config, _INTERPRETER_CONFIG))
    return dq, grads


class _AttentionFunction(torch.autograd.Function):
    """The forward of ``forward.py``, saving q, k, v, o and lse; the backward is the ``backward_fn``
    passed to ``apply`` -- the two-pass backward here or the fused one, which take the same tensors
    and both return dQ and the stacked (dK, dV). q, k, v and the scale come checked."""

    @staticmethod
    def forward(ctx, q, k, v, scale, backward_fn, record):
        ctx.scale, ctx.backward_fn, ctx.record = scale, backward_fn, record
        o, lse = _checked_forward(q, k, v, scale, record=record)
        ctx.save_for_backward(q, k, v, o, lse)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dkv = ctx.backward_fn(q, k, v, o, lse, do, ctx.scale, ctx.record)
        return dq, dkv[0], dkv[1], None, None, None


class _PackedAttentionFunction(torch.autograd.Function):
    """``_AttentionFunction`` over K and V packed as the model projects them, (B, Lk, 2, H, D): their
    gradient is the backward's dK/dV buffer itself, with no copy interleaving the two."""

    @staticmethod
    def forward(ctx, q, kv, scale, backward_fn, record):
        ctx.scale, ctx.backward_fn, ctx.record = scale, backward_fn, record
        o, lse = _checked_forward(q, *_split_kv(kv), scale, record=record)
        ctx.save_for_backward(q, kv, o, lse)
        return o

    @staticmethod
    def backward(ctx, do):
        q, kv, o, lse = ctx.saved_tensors
        dq, dkv = ctx.backward_fn(q, *_split_kv(kv), o, lse, do, ctx.scale, ctx.record)
        return dq, _packed(dkv), None, None, None


# --- custom ops: the same launches, opaque to torch.compile ----------------------------------------


def _attention_ops(name: str, backward_fn, forward_fn=_checked_forward):
    """Register ``tritonlab::{name}_forward`` -> (o, lse) running ``forward_fn`` (checked q, k, v,
    scale) and ``tritonlab::{name}_backward`` -> (dQ, stacked dK and dV) running ``backward_fn``,
    joined by an autograd formula; returns the forward op. The backward's dK and dV share one
    buffer, so they leave the op as one tensor (a custom op's outputs may not alias one another)
    and are split by the formula."""

    @torch.library.custom_op(f"tritonlab::{name}_forward", mutates_args=())
    def forward_op(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return forward_fn(q, k, v, scale)

    @forward_op.register_fake
    def _(q, k, v, scale):
        return _forward_outputs(q)

    @torch.library.custom_op(f"tritonlab::{name}_backward", mutates_args=())
    def backward_op(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        return backward_fn(q, k, v, o, lse, do, scale)

    @backward_op.register_fake
    def _(q, k, v, o, lse, do, scale):
        return _like_q_layout(q), _key_grad_buffers(k, n_chunks=1)[0]

    def setup_context(ctx, inputs, output):
        q, k, v, scale = inputs
        o, lse = output
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # no zero-filled gradient for lse
        ctx.scale = scale
        ctx.save_for_backward(q, k, v, o, lse)

    def backward(ctx, do, _grad_lse):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dkv = backward_op(q, k, v, o, lse, do, ctx.scale)
        return dq, dkv[0], dkv[1], None

    forward_op.register_autograd(backward, setup_context=setup_context)
    return forward_op


_ATTENTION_FORWARD = _attention_ops("attention", _two_pass_backward)


def _packed_attention_ops(name: str, backward_fn):
    """``_attention_ops`` over a packed kv: ``tritonlab::{name}_forward(q, kv, scale)`` -> (o, lse) and
    its backward -> (dQ, the packed dK/dV), one tensor as kv is."""

    @torch.library.custom_op(f"tritonlab::{name}_forward", mutates_args=())
    def forward_op(q: torch.Tensor, kv: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        return _checked_forward(q, *_split_kv(kv), scale)

    @forward_op.register_fake
    def _(q, kv, scale):
        return _forward_outputs(q)

    @torch.library.custom_op(f"tritonlab::{name}_backward", mutates_args=())
    def backward_op(
        q: torch.Tensor, kv: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dq, dkv = backward_fn(q, *_split_kv(kv), o, lse, do, scale)
        return dq, _packed(dkv)

    @backward_op.register_fake
    def _(q, kv, o, lse, do, scale):
        return _like_q_layout(q), _packed(_key_grad_buffers(_split_kv(kv)[0], n_chunks=1)[0])

    def setup_context(ctx, inputs, output):
        q, kv, scale = inputs
        o, lse = output
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        ctx.scale = scale
        ctx.save_for_backward(q, kv, o, lse)

    def backward(ctx, do, _grad_lse):
        q, kv, o, lse = ctx.saved_tensors
        dq, dkv = backward_op(q, kv, o, lse, do, ctx.scale)
        return dq, dkv, None

    forward_op.register_autograd(backward, setup_context=setup_context)
    return forward_op


def _attend(q, k, v, scale, record, backward_fn, forward_op, name: str) -> torch.Tensor:
    """Check the inputs, then run ``_AttentionFunction`` with ``backward_fn`` -- or, while
    torch.compile traces, ``forward_op``, the custom op registered with that same backward."""
    check_qkv(q, k, v, ndim=4)
    scale = softmax_scale(q.shape[-1], scale)
    if torch.compiler.is_compiling():
        refuse_record_under_compile(record, name)
        return forward_op(q, k, v, scale)[0]
    # Eager: the autograd function directly, without the custom op dispatcher's host time per call.
    return _AttentionFunction.apply(q, k, v, scale, backward_fn, record)


def _attend_kv(q, kv, scale, record, backward_fn, forward_op, name: str) -> torch.Tensor:
    """``_attend`` over a packed kv (``_PackedAttentionFunction``, or ``forward_op`` under compile)."""
    check_kv(kv)
    check_qkv(q, *_split_kv(kv), ndim=4)
    scale = softmax_scale(q.shape[-1], scale)
    if torch.compiler.is_compiling():
        refuse_record_under_compile(record, name)
        return forward_op(q, kv, scale)[0]
    return _PackedAttentionFunction.apply(q, kv, scale, backward_fn, record)


# Public signature as fused_attention's (attention_forward's adds impl): only what runs differs.
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    *,
    record: ConfigRecord | None = None,
) -> torch.Tensor:
    """Differentiable rectangular attention, softmax(scale · q kᵀ) v, with the deterministic two-pass
    backward. Inputs as ``attention_forward``'s; dQ, dK, dV come back in the layout of the model's
    (B, L, H·D) projections (free reshapes). ``record`` receives the configs of the forward and the
    backward's launches ("forward", "dkdv", "dq"); it cannot be passed under torch.compile."""
    return _attend(q, k, v, scale, record, _two_pass_backward, _ATTENTION_FORWARD, "attention")


__all__ = ["attention"]
