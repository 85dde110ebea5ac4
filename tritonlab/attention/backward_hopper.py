"""The two-pass attention backward's dK/dV pass on Hopper in Gluon, and the fused backward built on it.

With P recomputed from the forward's logsumexp, P = exp2(S·log2 e − lse·log2 e), and Δ = rowsum(dO ∘ O):

    dV = Pᵀ dO,   dPᵀ = V dOᵀ,   dSᵀ = Pᵀ ∘ (dPᵀ − Δ),   dK = scale · dSᵀ Q

the same gradients as ``backward.py``'s Triton ``_dkdv_kernel`` (whose dQ pass runs after this
one: no atomics, deterministic), written in Gluon like ``forward_hopper.py``: warp-specialised, one
load warp feeding a shared-memory ring through TMA, two MMA warpgroups that never wait for one
another. A program owns 128 keys (64 a warpgroup, K and V resident in shared memory) and streams
the query tiles past them: the load warp copies Q and dO (TMA) and stages the tile's lse and Δ in
shared memory beside them (their latency off the warpgroups' path: read from global memory in the
loop, it cost 16%). Per tile a warpgroup issues Sᵀ = K Qᵀ and dPᵀ = V dOᵀ together, builds Pᵀ as
soon as Sᵀ lands and issues dV += Pᵀ dO (Pᵀ from registers) while it waits for dPᵀ, then
dK += dSᵀ Q.

With ``FUSED_DQ`` (``fused.py``'s fused backward, and flash2's) both warpgroups store their dSᵀ to
shared memory, and the tile's dQ = scale · dS K over the program's 128 keys is the work of one of
them, alternating tile by tile: it waits for the other's dS (an mbarrier), issues the two products
(dS read transposed from shared memory), and adds the result into a float32 dQ with one TMA
reduction from a ring of ``DQ_STAGES`` staging tiles. By default (``DEFER_DQ``) the owner issues
those products a tile late, with the next tile's dK, so that its wait for the other's dS falls
behind work of its own (``_fused_tile``). Triton 3.6 builds that operation for Gluon
(``create_async_tma_reduce``) without exposing it, hence ``_tma_reduce_add``. A reduction a
warpgroup instead (twice the L2 traffic) measured within 1% at D = 64 and 3% slower at D = 128;
per-thread fp32 atomics, 9.71 against 7.14 ms forward + backward at mid (phase 04's README).

The fused, non-causal launch splits its last wave (``tail_split``): where the key blocks beyond
the last whole wave of one program an SM fill at most half the SMs, they run in a second launch as
programs over chunks of the query tiles (``SPLIT_TAIL``), adding their float32 dK, dV shares into a
small buffer that ``round_tail_sums`` rounds into the gradients; that launch issues its dQ
products immediately (ptxas of Triton 3.6 crashes on the deferred kernel with runtime tile bounds).

Rows past Lq or Lk read as zeros (4-D TMA descriptors over the caller's strides); padding query
rows get lse = +inf, so their P is 0. Causal (``CAUSAL``, top-left aligned; flash2 takes it): a
key block's query tiles start at its first key, the tiles that cross a warpgroup's diagonal run
masked in a loop of their own (the mask inside the main loop spilled 68 bytes a thread against
24), and the grid runs the first key blocks of every head first (they meet the most queries). Hopper only, 16-bit, D 64 or 128; tested on the GPU and built for
sm_90a on the CPU (Gluon does not run in Triton's interpreter).
"""

import torch
import triton
import triton.language as tl
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .._gluon import mma_layout, shared_layout
from .._launch import LaunchCache, first_launch, launch
from .._runtime import cdiv, sm_count
from ._common import LOG2E, tail_split
from .forward_hopper import descriptor

ROWS = 64  # one warpgroup's MMA rows
WARPGROUPS = 2


@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Add a shared-memory tile into global memory through TMA (``cp.reduce.async.bulk.tensor``):
    Triton 3.6 builds the operation for Gluon but does not expose it; this is its store's twin."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(
        ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle
    )


# --- dK, dV: a key block per program, query tiles streamed ------------------------------------


@gluon.jit
def _dkdv_load(q_desc, do_desc, k_desc, v_desc, k_bufs, v_bufs, q_bufs, do_bufs, lse_bufs, delta_bufs, kv_bars,
               ready_bars, empty_bars, LSE, DELTA, stats, b, h, key_start, Lq, first_tile, end_tile,
               BLOCK_M: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    KEYS: gl.constexpr = k_desc.block_type.shape[2]
    for w in gl.static_range(2):
        mbarrier.expect(kv_bars.index(w), 2 * k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            k_desc, [b, h, key_start + w * KEYS, 0], kv_bars.index(w), k_bufs.index(w)
        )
        tma.async_copy_global_to_shared(
            v_desc, [b, h, key_start + w * KEYS, 0], kv_bars.index(w), v_bufs.index(w)
        )
    for j in range(first_tile, end_tile):
        i = j - first_tile
        slot = i % STAGES
        mbarrier.wait(empty_bars.index(slot), ((i // STAGES) + 1) & 1, pred=i >= STAGES)
        bar = ready_bars.index(slot)
        mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, j * BLOCK_M, 0], bar, q_bufs.index(slot))
        tma.async_copy_global_to_shared(do_desc, [b, h, j * BLOCK_M, 0], bar, do_bufs.index(slot))
        # The tile's lse (base 2; +inf past Lq, so P = 0 there) and Δ, staged beside it: the
        # barrier's second arrival.
        r = j * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0]))
        lse_bufs.index(slot).store(
            gl.load(LSE + stats + r, mask=r < Lq, other=float("inf")) * 1.4426950408889634
        )
        delta_bufs.index(slot).store(gl.load(DELTA + stats + r, mask=r < Lq, other=0.0))
        mbarrier.arrive(bar, count=1)


@gluon.jit
def _tile_products(j, i, k, v, key_start, q_bufs, do_bufs, lse_bufs, delta_bufs, ready_bars, dk, dv, qk_scale,
                   MASKED: gl.constexpr):  # fmt: skip
    """A query tile's products up to dK, from ring slot ``i % STAGES`` once it has landed: Sᵀ and
    dPᵀ, Pᵀ (``MASKED``: the causal mask, for the tiles where some query precedes some of these
    keys), dV += Pᵀ dO issued while dPᵀ runs, dSᵀ, then dK += dSᵀ Q (unscaled). Returns the dV and
    dK products in flight, their register operands, and dSᵀ."""
    STAGES: gl.constexpr = q_bufs.shape[0]
    BLOCK_M: gl.constexpr = q_bufs.shape[3]
    HEAD_DIM: gl.constexpr = q_bufs.shape[4]
    KEYS: gl.constexpr = k.shape[0]
    dtype: gl.constexpr = q_bufs.dtype
    s_layout: gl.constexpr = mma_layout(BLOCK_M)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout(HEAD_DIM), k_width=2)
    q_cols: gl.constexpr = gl.SliceLayout(0, s_layout)
    s_zero = gl.zeros([KEYS, BLOCK_M], gl.float32, s_layout)

    slot = i % STAGES
    mbarrier.wait(ready_bars.index(slot), (i // STAGES) & 1)
    q_tile = q_bufs.index(slot).reshape([BLOCK_M, HEAD_DIM])
    do_tile = do_bufs.index(slot).reshape([BLOCK_M, HEAD_DIM])
    lse2 = lse_bufs.index(slot).load(q_cols)
    delta = delta_bufs.index(slot).load(q_cols)
    st_tok = warpgroup_mma(k, q_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    dpt_tok = warpgroup_mma(v, do_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s_t = warpgroup_mma_wait(1, deps=[st_tok])
    p_t = gl.exp2(s_t * qk_scale - lse2[None, :])
    if MASKED:
        rows = j * BLOCK_M + gl.arange(0, BLOCK_M, layout=q_cols)
        keys = key_start + gl.arange(0, KEYS, layout=gl.SliceLayout(1, s_layout))
        p_t = gl.where(rows[None, :] >= keys[:, None], p_t, 0.0)
    p_a = gl.convert_layout(p_t.to(dtype), a_layout)
    dv_tok = warpgroup_mma(p_a, do_tile, dv, is_async=True)
    dp_t = warpgroup_mma_wait(1, deps=[dpt_tok])
    ds_t = (p_t * (dp_t - delta[None, :])).to(dtype)
    ds_a = gl.convert_layout(ds_t, a_layout)
    dk_tok = warpgroup_mma(ds_a, q_tile, dk, is_async=True)
    return dv_tok, dk_tok, p_a, ds_a, ds_t


@gluon.jit
def _give_ds(ds_t, i, ds_bufs, ds_ready, ds_free, W: gl.constexpr):
    """Stores warpgroup ``W``'s dSᵀ of ring tile ``i``, a tile the other warpgroup owns, into the slot
    it gives (``(W, 1 - W)``) once the other has read the last one there, and signals ``ds_ready``."""
    use = i // 2
    mbarrier.wait(ds_free.index(W), (use + 1) & 1, pred=use >= 1)  # its last reader is done
    ds_bufs.index(1 + W).store(ds_t)
    fence_async_shared()
    gl.thread_barrier()  # every thread's dS is in shared memory before the one arrival
    mbarrier.arrive(ds_ready.index(W), count=1)


@gluon.jit
def _keep_ds(ds_t, ds_bufs, W: gl.constexpr):
    """Stores warpgroup ``W``'s dSᵀ of a tile it owns into its own slot ``(W, W)``, for its dQ."""
    ds_bufs.index(3 * W).store(ds_t)
    fence_async_shared()


@gluon.jit
def _owned_dq(i, k, k_other, ds_bufs, ds_ready, W: gl.constexpr):
    """Issues warpgroup ``W``'s dQ of its owned ring tile ``i``: scale-free dS K over both warpgroups'
    keys, once the other's dS has landed in shared memory (``ds_ready``)."""
    BLOCK_M: gl.constexpr = ds_bufs.shape[2]
    HEAD_DIM: gl.constexpr = k.shape[1]
    mbarrier.wait(ds_ready.index(1 - W), (i // 2) & 1)
    zero = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, mma_layout(HEAD_DIM))
    dq_tok = warpgroup_mma(ds_bufs.index(3 * W).permute((1, 0)), k, zero, use_acc=False, is_async=True)
    return warpgroup_mma(ds_bufs.index(2 - W).permute((1, 0)), k_other, dq_tok, is_async=True)


@gluon.jit
def _reduce_dq(dq, i, j, ds_free, dq_smem, dq_desc, b, h, scale, W: gl.constexpr):
    """Frees the other warpgroup's dS of ring tile ``i`` and adds ``dq`` (query tile ``j``) into
    the fp32 dQ by a TMA reduction from the staging ring."""
    BLOCK_M: gl.constexpr = dq_smem.shape[3]
    HEAD_DIM: gl.constexpr = dq_smem.shape[4]
    DQ_STAGES: gl.constexpr = dq_smem.shape[0]
    mbarrier.arrive(ds_free.index(1 - W), count=1)
    tma.store_wait(DQ_STAGES - 1)  # the reduction that last read this staging tile is done
    staged = dq_smem.index((i // 2) % DQ_STAGES)
    staged.reshape([BLOCK_M, HEAD_DIM]).store(dq * scale)
    fence_async_shared()
    _tma_reduce_add(dq_desc, [b, h, j * BLOCK_M, 0], staged)


@gluon.jit
def _dkdv_tile(j, i, k, v, key_start, q_bufs, do_bufs, lse_bufs, delta_bufs, ready_bars, empty_bars, dk, dv, qk_scale,
               k_other, ds_bufs, ds_ready, ds_free, dq_smem, dq_desc, b, h, scale, MASKED: gl.constexpr,
               FUSED_DQ: gl.constexpr, W: gl.constexpr):  # fmt: skip
    """One query tile's dV += Pᵀ dO and dK += dSᵀ Q (unscaled) from ring slot ``i % STAGES``
    (``_tile_products``). ``FUSED_DQ``: dS into ``ds_bufs`` too, and on the tiles this warpgroup
    ``W`` owns (i % 2 == W) the tile's dQ, scale · dS K over both warpgroups' keys, once the other's
    dS has landed, added into the fp32 dQ of ``dq_desc`` by one TMA reduction from a ring of
    staging tiles ``dq_smem``: a query tile's dQ crosses L2 once a program, not once a warpgroup."""
    slot = i % q_bufs.shape[0]
    dv_tok, dk_tok, p_a, ds_a, ds_t = _tile_products(j, i, k, v, key_start, q_bufs, do_bufs, lse_bufs, delta_bufs,
                                                     ready_bars, dk, dv, qk_scale, MASKED)  # fmt: skip
    if FUSED_DQ:
        if i % 2 == W:
            _keep_ds(ds_t, ds_bufs, W)
            dq_tok = _owned_dq(i, k, k_other, ds_bufs, ds_ready, W)
            dv, dk, dq, p_a, ds_a = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, dq_tok, p_a, ds_a])
            mbarrier.arrive(empty_bars.index(slot), count=1)
            _reduce_dq(dq, i, j, ds_free, dq_smem, dq_desc, b, h, scale, W)
        else:
            _give_ds(ds_t, i, ds_bufs, ds_ready, ds_free, W)
            dv, dk, p_a, ds_a = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, p_a, ds_a])
            mbarrier.arrive(empty_bars.index(slot), count=1)
    else:
        dv, dk, p_a, ds_a = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, p_a, ds_a])
        mbarrier.arrive(empty_bars.index(slot), count=1)
    return dk, dv


@gluon.jit
def _fused_tile(j, i, k, v, k_other, key_start, q_bufs, do_bufs, lse_bufs, delta_bufs, ready_bars, empty_bars, dk, dv,
                qk_scale, ds_bufs, ds_ready, ds_free, dq_smem, dq_desc, b, h, scale, MASKED: gl.constexpr,
                W: gl.constexpr, OWN: gl.constexpr, PRIOR: gl.constexpr):  # fmt: skip
    """The deferred fused backward's query tile ``j`` (ring tile ``i``) for warpgroup ``W``: dV and
    dK as ``_dkdv_tile``'s, dS into shared memory -- its own slot (``OWN``: this warpgroup's dQ
    tile, the product issued with the next tile) or the one it gives the other warpgroup. A given
    tile with ``PRIOR`` also issues the previous (owned) tile's dQ beside its dK, a tile after the
    other warpgroup gave its half of dS (no waiting in lockstep), and reduces it at the end."""
    slot = i % q_bufs.shape[0]
    dv_tok, dk_tok, p_a, ds_a, ds_t = _tile_products(j, i, k, v, key_start, q_bufs, do_bufs, lse_bufs, delta_bufs,
                                                     ready_bars, dk, dv, qk_scale, MASKED)  # fmt: skip
    if PRIOR:
        dq_tok = _owned_dq(i - 1, k, k_other, ds_bufs, ds_ready, W)
    if OWN:
        _keep_ds(ds_t, ds_bufs, W)  # read by this warpgroup's product with the next tile
        dv, dk, p_a, ds_a = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, p_a, ds_a])
        mbarrier.arrive(empty_bars.index(slot), count=1)
    else:
        _give_ds(ds_t, i, ds_bufs, ds_ready, ds_free, W)
        if PRIOR:
            dv, dk, dq, p_a, ds_a = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, dq_tok, p_a, ds_a])
            mbarrier.arrive(empty_bars.index(slot), count=1)
            _reduce_dq(dq, i - 1, j - 1, ds_free, dq_smem, dq_desc, b, h, scale, W)
        else:
            dv, dk, p_a, ds_a = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, p_a, ds_a])
            mbarrier.arrive(empty_bars.index(slot), count=1)
    return dk, dv


@gluon.jit
def _fused_pairs(t_from, t_to, n, first_tile, k, v, k_other, key_start, q_bufs, do_bufs, lse_bufs, delta_bufs,
                 ready_bars, empty_bars, dk, dv, qk_scale, ds_bufs, ds_ready, ds_free, dq_smem, dq_desc, b, h, scale,
                 MASKED: gl.constexpr, W: gl.constexpr):  # fmt: skip
    """Warpgroup ``W``'s owned ring tiles t in [t_from, t_to) (step 2), each with the given tile after
    it (whose work carries the owned tile's dQ), or, past the last of ``n`` tiles, its dQ alone."""
    for t in range(t_from, t_to, 2):
        dk, dv = _fused_tile(t + first_tile, t, k, v, k_other, key_start, q_bufs, do_bufs, lse_bufs, delta_bufs,
                             ready_bars, empty_bars, dk, dv, qk_scale, ds_bufs, ds_ready, ds_free, dq_smem, dq_desc,
                             b, h, scale, MASKED, W, True, False)  # fmt: skip
        if t + 1 < n:
            dk, dv = _fused_tile(t + 1 + first_tile, t + 1, k, v, k_other, key_start, q_bufs, do_bufs, lse_bufs,
                                 delta_bufs, ready_bars, empty_bars, dk, dv, qk_scale, ds_bufs, ds_ready, ds_free,
                                 dq_smem, dq_desc, b, h, scale, MASKED, W, False, True)  # fmt: skip
        else:
            dq_tok = _owned_dq(t, k, k_other, ds_bufs, ds_ready, W)
            dq = warpgroup_mma_wait(0, deps=[dq_tok])
            _reduce_dq(dq, t, t + first_tile, ds_free, dq_smem, dq_desc, b, h, scale, W)
    return dk, dv


@gluon.jit
def _dkdv_compute(k_bufs, v_bufs, kv_bars, q_bufs, do_bufs, lse_bufs, delta_bufs, ready_bars, empty_bars, GRADS, scale,
                  qk_scale, stride_gs, stride_gb, stride_gh, stride_gl, b, h, key_start, Lk, first_tile, end_tile,
                  ds_bufs, ds_ready, ds_free, dq_smem, dq_desc, TAIL, tail_index, CAUSAL: gl.constexpr,
                  FUSED_DQ: gl.constexpr, W: gl.constexpr, DEFER: gl.constexpr, SPLIT_TAIL: gl.constexpr):  # fmt: skip
    BLOCK_M: gl.constexpr = q_bufs.shape[3]
    HEAD_DIM: gl.constexpr = q_bufs.shape[4]
    KEYS: gl.constexpr = k_bufs.shape[3]
    dtype: gl.constexpr = q_bufs.dtype
    g_layout: gl.constexpr = mma_layout(HEAD_DIM)

    k = k_bufs.index(W).reshape([KEYS, HEAD_DIM])
    v = v_bufs.index(W).reshape([KEYS, HEAD_DIM])
    k_other = k_bufs.index(1 - W).reshape([KEYS, HEAD_DIM])
    dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, g_layout)
    dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, g_layout)
    mbarrier.wait(kv_bars.index(W), 0)
    if FUSED_DQ:
        mbarrier.wait(kv_bars.index(1 - W), 0)  # the other warpgroup's keys: half of every owned dQ
    # Causal: the tiles with some query before some of these keys run masked, in a loop of their own
    # (at 168 registers the mask in the main loop spilled 68 bytes a thread, against 12 without it).
    unmasked_from = first_tile
    if CAUSAL:
        unmasked_from = gl.minimum(gl.cdiv(key_start + KEYS, BLOCK_M), end_tile)
    if FUSED_DQ and DEFER:
        # Tiles in pairs (owned, given): warpgroup 1 gives tile 0 alone first. Pairs that reach a
        # tile needing the mask run masked (harmless on the other).
        n = end_tile - first_tile
        if W == 1 and n > 0:
            dk, dv = _fused_tile(first_tile, 0, k, v, k_other, key_start, q_bufs, do_bufs, lse_bufs, delta_bufs,
                                 ready_bars, empty_bars, dk, dv, qk_scale, ds_bufs, ds_ready, ds_free, dq_smem,
                                 dq_desc, b, h, scale, CAUSAL, W, False, False)  # fmt: skip
        masked_to = W + 2 * gl.cdiv(gl.maximum(unmasked_from - first_tile - W, 0), 2)
        if CAUSAL:
            dk, dv = _fused_pairs(W, masked_to, n, first_tile, k, v, k_other, key_start, q_bufs, do_bufs, lse_bufs,
                                  delta_bufs, ready_bars, empty_bars, dk, dv, qk_scale, ds_bufs, ds_ready, ds_free,
                                  dq_smem, dq_desc, b, h, scale, True, W)  # fmt: skip
        dk, dv = _fused_pairs(masked_to, n, n, first_tile, k, v, k_other, key_start, q_bufs, do_bufs, lse_bufs,
                              delta_bufs, ready_bars, empty_bars, dk, dv, qk_scale, ds_bufs, ds_ready, ds_free,
                              dq_smem, dq_desc, b, h, scale, False, W)  # fmt: skip
    else:
        if CAUSAL:
            for j in range(first_tile, unmasked_from):
                dk, dv = _dkdv_tile(j, j - first_tile, k, v, key_start, q_bufs, do_bufs, lse_bufs, delta_bufs,
                                    ready_bars, empty_bars, dk, dv, qk_scale, k_other, ds_bufs, ds_ready, ds_free,
                                    dq_smem, dq_desc, b, h, scale, True, FUSED_DQ, W)  # fmt: skip
        for j in range(unmasked_from, end_tile):
            dk, dv = _dkdv_tile(j, j - first_tile, k, v, key_start, q_bufs, do_bufs, lse_bufs, delta_bufs, ready_bars,
                                empty_bars, dk, dv, qk_scale, k_other, ds_bufs, ds_ready, ds_free, dq_smem, dq_desc, b,
                                h, scale, False, FUSED_DQ, W)  # fmt: skip

    if FUSED_DQ:
        tma.store_wait(0)
    keys = key_start + gl.arange(0, KEYS, layout=gl.SliceLayout(1, g_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, g_layout))
    offs = b.to(gl.int64) * stride_gb + h.to(gl.int64) * stride_gh + keys.to(gl.int64)[:, None] * stride_gl
    offs = offs + cols[None, :]
    mask = (keys < Lk)[:, None]
    if SPLIT_TAIL:
        # One query chunk of a tail key block: its float32 share, added to the block's slot of TAIL
        # (tail blocks, dK / dV, 2 * KEYS keys, D), which _tail_grads_kernel rounds into GRADS.
        rows = (keys - key_start + W * KEYS).to(gl.int64) + tail_index.to(gl.int64) * (4 * KEYS)
        t_offs = rows[:, None] * HEAD_DIM + cols[None, :]
        gl.atomic_add(TAIL + t_offs, dk * scale, mask=mask, sem="relaxed")
        gl.atomic_add(TAIL + 2 * KEYS * HEAD_DIM + t_offs, dv, mask=mask, sem="relaxed")
    else:
        gl.store(GRADS + offs, (dk * scale).to(dtype), mask=mask)
        gl.store(GRADS + stride_gs + offs, dv.to(dtype), mask=mask)


@gluon.jit
def _dkdv_kernel(
    q_desc, k_desc, v_desc, do_desc, LSE, DELTA, GRADS, dq_desc, TAIL, scale, qk_scale,
    stride_gs, stride_gb, stride_gh, stride_gl, H, Lq, Lk, first_block, split,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr = False,
    REGS: gl.constexpr = 240, FUSED_DQ: gl.constexpr = False, DS_LAYOUT: gl.constexpr = None,
    DQ_STAGES: gl.constexpr = 1, DEFER: gl.constexpr = False, SPLIT_TAIL: gl.constexpr = False,
):  # fmt: skip
    dtype: gl.constexpr = q_desc.dtype
    KEYS: gl.constexpr = k_desc.block_type.shape[2]  # one warpgroup's keys: ROWS
    BLOCK_N: gl.constexpr = 2 * KEYS  # a program's keys: two warpgroups'
    n_k = gl.cdiv(Lk, BLOCK_N)
    pid = gl.program_id(0)
    n_tiles = gl.cdiv(Lq, BLOCK_M)
    first_tile = 0
    last_tile = n_tiles
    tail_index = -1
    if SPLIT_TAIL:
        # A launch of the tail's query chunks (``tail_split``): key block ``first_block + pid // split``
        # over chunk ``pid % split`` of the query tiles.
        tail_index = pid // split
        chunk = pid % split
        pid = first_block + tail_index
        first_tile = chunk * n_tiles // split
        last_tile = (chunk + 1) * n_tiles // split
    if CAUSAL:
        # Heaviest first: the first key block of every head (it meets every query), then the next; a
        # block's queries start at its first key's tile.
        n_bh = gl.num_programs(0) // n_k
        pid_bh = pid % n_bh
        key_start = (pid // n_bh) * BLOCK_N
        first_tile = gl.minimum(key_start // BLOCK_M, n_tiles)
    else:
        pid_bh = pid // n_k
        key_start = (pid % n_k) * BLOCK_N
    b = pid_bh // H
    h = pid_bh % H

    k_bufs = gl.allocate_shared_memory(dtype, [2] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [2] + v_desc.block_type.shape, v_desc.layout)
    q_bufs = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_bufs = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    row_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    lse_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], row_layout)
    delta_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], row_layout)
    kv_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ready_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(kv_bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready_bars.index(i), count=2)  # the TMA copies' expect, and the staged stats
        mbarrier.init(empty_bars.index(i), count=2)
    stats = pid_bh.to(gl.int64) * Lq
    if FUSED_DQ:
        # dS by (warpgroup, tile parity), index 2 * warpgroup + parity: a warpgroup's own (W, W) and
        # the one it gives the other (W, 1 - W)
        ds_bufs = gl.allocate_shared_memory(dtype, [4, KEYS, BLOCK_M], DS_LAYOUT)
        ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(ds_ready.index(i), count=1)
            mbarrier.init(ds_free.index(i), count=1)
        dq_0 = gl.allocate_shared_memory(gl.float32, [DQ_STAGES] + dq_desc.block_type.shape, dq_desc.layout)
        dq_1 = gl.allocate_shared_memory(gl.float32, [DQ_STAGES] + dq_desc.block_type.shape, dq_desc.layout)
    else:
        ds_bufs = lse_bufs  # unused
        ds_ready = kv_bars
        ds_free = kv_bars
        dq_0 = lse_bufs
        dq_1 = lse_bufs

    gl.warp_specialize(
        [
            (_dkdv_compute, (k_bufs, v_bufs, kv_bars, q_bufs, do_bufs, lse_bufs, delta_bufs, ready_bars, empty_bars,
                             GRADS, scale, qk_scale, stride_gs, stride_gb, stride_gh, stride_gl, b, h, key_start, Lk,
                             first_tile, last_tile, ds_bufs, ds_ready, ds_free, dq_0, dq_desc, TAIL, tail_index,
                             CAUSAL, FUSED_DQ, 0, DEFER, SPLIT_TAIL)),
            (_dkdv_compute, (k_bufs, v_bufs, kv_bars, q_bufs, do_bufs, lse_bufs, delta_bufs, ready_bars, empty_bars,
                             GRADS, scale, qk_scale, stride_gs, stride_gb, stride_gh, stride_gl, b, h,
                             key_start + KEYS, Lk, first_tile, last_tile, ds_bufs, ds_ready, ds_free, dq_1, dq_desc,
                             TAIL, tail_index, CAUSAL, FUSED_DQ, 1, DEFER, SPLIT_TAIL)),
            (_dkdv_load, (q_desc, do_desc, k_desc, v_desc, k_bufs, v_bufs, q_bufs, do_bufs, lse_bufs, delta_bufs,
                          kv_bars, ready_bars, empty_bars, LSE, DELTA, stats, b, h, key_start, Lq, first_tile,
                          last_tile, BLOCK_M, STAGES)),
        ],
        [4, 1],
        [REGS, 24],
    )  # fmt: skip


# --- the split tail: the last wave's key blocks in query chunks ----------------------------------


@triton.jit
def _tail_grads_kernel(TAIL, GRADS, whole_programs, n_k, H, Lk, stride_gs, stride_gb, stride_gh, stride_gl,
                       BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):  # fmt: skip
    """Tail block ``program_id(0)``'s summed float32 dK (``program_id(1)`` 0) or dV (1), rounded into
    its rows of GRADS."""
    t = tl.program_id(0)
    g = tl.program_id(1)
    block = whole_programs + t
    pid_bh = block // n_k
    keys = (block % n_k) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, HEAD_DIM)
    rows = (t * 2 + g) * BLOCK_N + tl.arange(0, BLOCK_N)
    x = tl.load(TAIL + rows.to(tl.int64)[:, None] * HEAD_DIM + cols[None, :])
    b = pid_bh // H
    h = pid_bh % H
    offs = g * stride_gs + b.to(tl.int64) * stride_gb + h.to(tl.int64) * stride_gh
    offs = offs + keys.to(tl.int64)[:, None] * stride_gl + cols[None, :]
    tl.store(GRADS + offs, x.to(GRADS.dtype.element_ty), mask=(keys < Lk)[:, None])


def round_tail_sums(tail_sums, grads, whole_programs: int, n_k: int) -> None:
    """The tail blocks' float32 dK, dV sums ``tail_sums`` (tail blocks, 2, BLOCK_N, D) into their
    rows of ``grads`` (2, B, H, Lk, D, unit stride along D); block t is program ``whole_programs + t``
    of a grid of ``n_k`` key blocks a head."""
    n_tail, _, block_n, D = tail_sums.shape
    _, _, H, Lk, _ = grads.shape
    launch(
        _TAIL_LAUNCHES,
        _tail_grads_kernel,
        (n_tail, 2),
        (tail_sums, grads),
        (whole_programs, n_k, H, Lk, *grads.stride()[:4]),
        {"BLOCK_N": block_n, "HEAD_DIM": D, "num_warps": 4},
    )


# (BLOCK_M: the query tile, STAGES, REGS: the registers a thread of the second MMA warpgroup asks
# for), per D. Measured on the H100, kernel alone (reports/data/03_attn_bwd/diagnostics/
# gluon_dkdv_regs_*): at D = 64 240 registers (no spills; 12 bytes at 168) take the mid shape from
# 3.38 to 3.01 ms and the causal flash2 goal shape from 2.08 to 1.86, 3 stages within 1% of 2; at
# D = 128 (40 bytes spilled, 100 causal) 64-row tiles beat 32-row ones (spill-free): 4.99 ms against
# 5.76 at mid, 1.51x the Triton kernel.
CONFIGS = {64: (64, 3, 240), 128: (64, 2, 240)}


# The fused backward's (BLOCK_M, STAGES, REGS, DQ_STAGES: dQ staging tiles a warpgroup), measured on
# the H100, kernel alone (reports/data/04_fused_attn/diagnostics/gluon_fused_*): at D = 64 two staging
# tiles and 2 stages, 5.269 ms at mid against 5.246 for the two-pass backward (one tile: 5.361; 3
# stages: 5.392 / 5.408), 472.1 ms at large against 489.3, and 3.184 at flash2's causal goal shape
# against 3.514. At D = 128 the fused kernel spills (264 bytes a thread) and loses to the two-pass
# one (5.565 against 4.995 ms at mid): no entry, callers take the two-pass backward there.
FUSED_CONFIGS = {64: (64, 2, 240, 2)}
# Whether the fused backward defers each owned tile's dQ products a tile (``_fused_tile``) unless the
# caller says otherwise; it builds with 2 ring stages only. Measured on the H100, kernel alone, same
# gradients (diagnostics/gluon_fused_defer_6b6d01d51f37-h100.txt): 5.000 ms at mid against 5.308
# immediate, 458.2 at large against 480.4, 3.121 at flash2's causal goal shape against 3.228.
DEFER_DQ = True


_LAUNCHES = LaunchCache(first_launch)
_TAIL_LAUNCHES = LaunchCache(first_launch)


def launch_config(
    head_dim: int, fused: bool, config: tuple | None = None, dq_stages: int | None = None
) -> tuple[int, int, int, int]:
    """(BLOCK_M, STAGES, REGS, DQ_STAGES) of a launch: ``CONFIGS`` (one unused staging tile) or, fused,
    ``FUSED_CONFIGS`` at ``head_dim``, with ``config`` (BLOCK_M, STAGES, REGS) and ``dq_stages`` over
    them where given."""
    block_m, stages, regs, *staging = FUSED_CONFIGS[head_dim] if fused else (*CONFIGS[head_dim], 1)
    if config is not None:
        block_m, stages, regs = config
    return block_m, stages, regs, staging[0] if dq_stages is None else dq_stages


def _deferred(defer: bool | None, stages: int) -> bool:
    """Whether a fused launch with ``stages`` ring stages defers its dQ: ``defer``, or by default
    ``DEFER_DQ`` where the ring has 2 stages."""
    if defer is None:
        return DEFER_DQ and stages <= 2
    if defer and stages > 2:
        raise ValueError(
            f"config: defer=True builds with 2 ring stages, got {stages} (ptxas of Triton 3.6 crashes at 3)"
        )
    return defer


def config_string(head_dim: int, fused: bool = False) -> str:
    """The dK/dV launch's config at ``head_dim`` (``fused``: the fused backward's), as rows record it."""
    block_m, stages, regs, dq_stages = launch_config(head_dim, fused)
    dq = f",dq=tma-reduce,dq_stages={dq_stages}" + (",deferred" if _deferred(None, stages) else "")
    return (
        f"gluon:BLOCK_N={ROWS * WARPGROUPS},BLOCK_M={block_m},stages={stages},regs={regs},"
        f"warpgroups={WARPGROUPS}+load" + (dq if fused else "")
    )


def dkdv(
    q,
    k,
    v,
    lse,
    do,
    delta,
    grads,
    scale: float,
    causal: bool = False,
    config: tuple | None = None,
    dq=None,
    dq_stages: int | None = None,
    defer: bool | None = None,
    tail: tuple[int, int] | None = None,
) -> None:
    """dK and dV into ``grads`` (2, B, H, Lk, D) for inputs ``forward_hopper`` takes (D in CONFIGS);
    ``lse`` is the forward's and ``delta`` Δ, both (B, H, Lq) float32 and contiguous; ``causal``
    keeps key j for query i when i >= j (top-left aligned). With ``dq``, a zeroed float32
    (B, H, Lq, D) tensor in strides a tensor descriptor can address, dQ is added into it too, by
    TMA reductions: the fused backward, whose dQ sum runs in no fixed order; ``defer``: its dQ
    products issued a tile late (see ``_fused_tile``; by default ``DEFER_DQ`` at 2 ring stages, the
    only count it builds with).
    ``config`` (BLOCK_M, STAGES, REGS) and ``dq_stages`` override ``CONFIGS[D]``, or with ``dq``
    ``FUSED_CONFIGS[D]``. ``tail`` (tail blocks, split) overrides ``tail_split``'s choice for a
    non-causal fused launch: the last blocks' dK, dV then sum in float32 across their query chunks
    (in no fixed order, as dQ's)."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    fused = dq is not None
    block_m, stages, regs, dq_stages = launch_config(D, fused, config, dq_stages)
    defer = fused and _deferred(defer, stages)
    n_k = cdiv(Lk, ROWS * WARPGROUPS)
    programs = n_k * B * H
    if tail is not None and (causal or not fused):
        raise ValueError("tail: only a non-causal fused launch (with dq) splits its last key blocks")
    n_tail, split = (
        (0, 1) if causal or not fused else tail or tail_split(programs, sm_count(q.device), cdiv(Lq, block_m))
    )
    if not (0 <= n_tail <= programs and split >= 1):
        raise ValueError(f"tail: expected (blocks in 0..{programs}, split >= 1), got {tail}")
    whole = programs - n_tail
    tail_sums = None
    if n_tail:
        tail_sums = torch.zeros((n_tail, 2, ROWS * WARPGROUPS, D), dtype=torch.float32, device=q.device)
    tensors = (
        descriptor(q, block_m), descriptor(k, ROWS), descriptor(v, ROWS), descriptor(do, block_m), lse, delta, grads,
        descriptor(dq, block_m) if fused else None,
    )  # fmt: skip
    scalars = (float(scale), float(scale * LOG2E), *grads.stride()[:4], H, Lq, Lk)
    constexprs = {
        "HEAD_DIM": D, "BLOCK_M": block_m, "STAGES": stages, "CAUSAL": causal, "REGS": regs, "FUSED_DQ": fused,
        "DS_LAYOUT": shared_layout((ROWS, block_m), q.dtype) if fused else None, "DQ_STAGES": dq_stages,
        "num_warps": 4,
    }  # fmt: skip
    # The whole blocks, then the tail's chunks in a launch of their own: with its dQ products issued
    # immediately, as ptxas of Triton 3.6 crashes on the deferred kernel with runtime tile bounds.
    launches = [(whole, None, 0, 1, defer), (n_tail * split, tail_sums, whole, split, False)]
    for grid, sums, first_block, chunks, deferred in launches:
        if grid:
            launch(
                _LAUNCHES,
                _dkdv_kernel,
                (grid,),
                (*tensors, sums),
                (*scalars, first_block, chunks),
                {**constexprs, "DEFER": deferred, "SPLIT_TAIL": sums is not None},
                key_tensors=(q, k, v, do, grads, sums),
            )
    if n_tail:
        round_tail_sums(tail_sums, grads, whole, n_k)


__all__ = [
    "CONFIGS",
    "DEFER_DQ",
    "FUSED_CONFIGS",
    "config_string",
    "dkdv",
    "launch_config",
    "round_tail_sums",
]
