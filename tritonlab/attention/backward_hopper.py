"""The two-pass attention backward on Hopper in Gluon: dK/dV by key block, then dQ by query block.

With P = exp2(S·log2 e − lse·log2 e) recomputed from the forward's logsumexp and Δ = rowsum(dO ∘ O):

    dV = Pᵀ dO,   dPᵀ = V dOᵀ,   dSᵀ = Pᵀ ∘ (dPᵀ − Δ),   dK = scale · dSᵀ Q,   dQ = scale · dS K

the same gradients as ``backward.py``'s Triton kernels, in the same two deterministic passes (no
atomics), written in Gluon like ``forward_hopper.py``: warp-specialised, one load warp feeding a
shared-memory ring through TMA, two MMA warpgroups of 64 rows each that never wait for one
another.

- ``_dkdv_kernel``: a program owns 128 keys (64 a warpgroup, K and V resident in shared memory) and
  streams the query tiles Q, dO past them. Per tile a warpgroup issues Sᵀ = K Qᵀ and dPᵀ = V dOᵀ
  together, builds Pᵀ as soon as Sᵀ lands and issues dV += Pᵀ dO (Pᵀ from registers) while it
  waits for dPᵀ, then dK += dSᵀ Q.
- ``_dq_kernel``: a program owns 128 query rows (Q and dO resident) and streams K, V: S = Q Kᵀ and
  dP = dO Vᵀ together, then dQ += dS K (dS from registers); the key columns past Lk are masked on
  the last tile only.

Rows past Lq or Lk read as zeros (4-D TMA descriptors over the caller's strides); padding query
rows get lse = +inf, so their P is 0. Hopper only, 16-bit, D in 64 or 128; tested on the GPU and
built for sm_90a on the CPU (Gluon does not run in Triton's interpreter).
"""

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .._launch import LaunchCache, first_launch, launch
from .forward_hopper import descriptor

ROWS = 64  # one warpgroup's MMA rows
WARPGROUPS = 2
LOG2E = 1.4426950408889634


@gluon.constexpr_function
def _mma_layout(n):
    """A warpgroup's accumulator layout for 64 x n results (wgmma's m16 x n instructions)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


# --- dK, dV: a key block per program, query tiles streamed ------------------------------------


@gluon.jit
def _dkdv_load(q_desc, do_desc, k_desc, v_desc, k_bufs, v_bufs, q_bufs, do_bufs, lse_bufs, delta_bufs, kv_bars,
               ready_bars, empty_bars, LSE, DELTA, stats, b, h, key_start, Lq, n_tiles, BLOCK_M: gl.constexpr,
               STAGES: gl.constexpr):  # fmt: skip
    for w in gl.static_range(2):
        mbarrier.expect(kv_bars.index(w), 2 * k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            k_desc, [b, h, key_start + w * 64, 0], kv_bars.index(w), k_bufs.index(w)
        )
        tma.async_copy_global_to_shared(
            v_desc, [b, h, key_start + w * 64, 0], kv_bars.index(w), v_bufs.index(w)
        )
    for j in range(n_tiles):
        slot = j % STAGES
        mbarrier.wait(empty_bars.index(slot), ((j // STAGES) + 1) & 1, pred=j >= STAGES)
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
def _dkdv_compute(k_smem, v_smem, kv_bar, q_bufs, do_bufs, lse_bufs, delta_bufs, ready_bars, empty_bars, GRADS, scale,
                  qk_scale, stride_gs, stride_gb, stride_gh, stride_gl, b, h, key_start, Lk, n_tiles):  # fmt: skip
    STAGES: gl.constexpr = q_bufs.shape[0]
    BLOCK_M: gl.constexpr = q_bufs.shape[3]
    HEAD_DIM: gl.constexpr = q_bufs.shape[4]
    KEYS: gl.constexpr = k_smem.shape[2]
    dtype: gl.constexpr = q_bufs.dtype
    s_layout: gl.constexpr = _mma_layout(BLOCK_M)
    g_layout: gl.constexpr = _mma_layout(HEAD_DIM)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=g_layout, k_width=2)
    q_cols: gl.constexpr = gl.SliceLayout(0, s_layout)

    k = k_smem.reshape([KEYS, HEAD_DIM])
    v = v_smem.reshape([KEYS, HEAD_DIM])
    s_zero = gl.zeros([KEYS, BLOCK_M], gl.float32, s_layout)
    dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, g_layout)
    dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, g_layout)
    mbarrier.wait(kv_bar, 0)
    for j in range(n_tiles):
        slot = j % STAGES
        mbarrier.wait(ready_bars.index(slot), (j // STAGES) & 1)
        q_tile = q_bufs.index(slot).reshape([BLOCK_M, HEAD_DIM])
        do_tile = do_bufs.index(slot).reshape([BLOCK_M, HEAD_DIM])
        lse2 = lse_bufs.index(slot).load(q_cols)
        delta = delta_bufs.index(slot).load(q_cols)
        st_tok = warpgroup_mma(k, q_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        dpt_tok = warpgroup_mma(v, do_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s_t = warpgroup_mma_wait(1, deps=[st_tok])
        p_t = gl.exp2(s_t * qk_scale - lse2[None, :])
        p_a = gl.convert_layout(p_t.to(dtype), a_layout)
        dv_tok = warpgroup_mma(p_a, do_tile, dv, is_async=True)
        dp_t = warpgroup_mma_wait(1, deps=[dpt_tok])
        ds_a = gl.convert_layout((p_t * (dp_t - delta[None, :])).to(dtype), a_layout)
        dk_tok = warpgroup_mma(ds_a, q_tile, dk, is_async=True)
        dv, dk, p_a, ds_a = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, p_a, ds_a])
        mbarrier.arrive(empty_bars.index(slot), count=1)

    keys = key_start + gl.arange(0, KEYS, layout=gl.SliceLayout(1, g_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, g_layout))
    offs = b.to(gl.int64) * stride_gb + h.to(gl.int64) * stride_gh + keys.to(gl.int64)[:, None] * stride_gl
    offs = offs + cols[None, :]
    mask = (keys < Lk)[:, None]
    gl.store(GRADS + offs, (dk * scale).to(dtype), mask=mask)
    gl.store(GRADS + stride_gs + offs, dv.to(dtype), mask=mask)


@gluon.jit
def _dkdv_kernel(
    q_desc, k_desc, v_desc, do_desc, LSE, DELTA, GRADS, scale, qk_scale,
    stride_gs, stride_gb, stride_gh, stride_gl, H, Lq, Lk,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
):  # fmt: skip
    dtype: gl.constexpr = q_desc.dtype
    n_k = gl.cdiv(Lk, 128)
    pid = gl.program_id(0)
    pid_bh = pid // n_k
    key_start = (pid % n_k) * 128
    b = pid_bh // H
    h = pid_bh % H
    n_tiles = gl.cdiv(Lq, BLOCK_M)

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

    gl.warp_specialize(
        [
            (_dkdv_compute, (k_bufs.index(0), v_bufs.index(0), kv_bars.index(0), q_bufs, do_bufs, lse_bufs,
                             delta_bufs, ready_bars, empty_bars, GRADS, scale, qk_scale, stride_gs, stride_gb,
                             stride_gh, stride_gl, b, h, key_start, Lk, n_tiles)),
            (_dkdv_compute, (k_bufs.index(1), v_bufs.index(1), kv_bars.index(1), q_bufs, do_bufs, lse_bufs,
                             delta_bufs, ready_bars, empty_bars, GRADS, scale, qk_scale, stride_gs, stride_gb,
                             stride_gh, stride_gl, b, h, key_start + 64, Lk, n_tiles)),
            (_dkdv_load, (q_desc, do_desc, k_desc, v_desc, k_bufs, v_bufs, q_bufs, do_bufs, lse_bufs, delta_bufs,
                          kv_bars, ready_bars, empty_bars, LSE, DELTA, stats, b, h, key_start, Lq, n_tiles, BLOCK_M,
                          STAGES)),
        ],
        [4, 1],
        [168, 24],
    )  # fmt: skip


# --- dQ: a query block per program, key tiles streamed ----------------------------------------


@gluon.jit
def _dq_load(q_desc, do_desc, k_desc, v_desc, q_bufs, do_bufs, k_bufs, v_bufs, qd_bars, ready_bars, empty_bars,
             b, h, row_start, n_tiles, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    for w in gl.static_range(2):
        mbarrier.expect(qd_bars.index(w), 2 * q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            q_desc, [b, h, row_start + w * 64, 0], qd_bars.index(w), q_bufs.index(w)
        )
        tma.async_copy_global_to_shared(
            do_desc, [b, h, row_start + w * 64, 0], qd_bars.index(w), do_bufs.index(w)
        )
    for j in range(n_tiles):
        slot = j % STAGES
        mbarrier.wait(empty_bars.index(slot), ((j // STAGES) + 1) & 1, pred=j >= STAGES)
        bar = ready_bars.index(slot)
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [b, h, j * BLOCK_N, 0], bar, k_bufs.index(slot))
        tma.async_copy_global_to_shared(v_desc, [b, h, j * BLOCK_N, 0], bar, v_bufs.index(slot))


@gluon.jit
def _dq_compute(q_smem, do_smem, qd_bar, k_bufs, v_bufs, ready_bars, empty_bars, LSE, DELTA, DQ, scale, qk_scale,
                stride_qb, stride_qh, stride_ql, b, h, pid_bh, row_start, Lq, Lk, n_tiles):  # fmt: skip
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    HEAD_DIM: gl.constexpr = k_bufs.shape[4]
    QROWS: gl.constexpr = q_smem.shape[2]
    dtype: gl.constexpr = k_bufs.dtype
    s_layout: gl.constexpr = _mma_layout(BLOCK_N)
    g_layout: gl.constexpr = _mma_layout(HEAD_DIM)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=g_layout, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)

    q = q_smem.reshape([QROWS, HEAD_DIM])
    do = do_smem.reshape([QROWS, HEAD_DIM])
    s_zero = gl.zeros([QROWS, BLOCK_N], gl.float32, s_layout)
    dq = gl.zeros([QROWS, HEAD_DIM], gl.float32, g_layout)
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    r = row_start + gl.arange(0, QROWS, layout=s_rows)
    stats = pid_bh.to(gl.int64) * Lq
    lse2 = gl.load(LSE + stats + r, mask=r < Lq, other=float("inf")) * 1.4426950408889634
    delta = gl.load(DELTA + stats + r, mask=r < Lq, other=0.0)
    mbarrier.wait(qd_bar, 0)
    for j in range(n_tiles):
        slot = j % STAGES
        mbarrier.wait(ready_bars.index(slot), (j // STAGES) & 1)
        k_tile = k_bufs.index(slot).reshape([BLOCK_N, HEAD_DIM])
        v_tile = v_bufs.index(slot).reshape([BLOCK_N, HEAD_DIM])
        s_tok = warpgroup_mma(q, k_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(do, v_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        s = s * qk_scale - lse2[:, None]
        if (j + 1) * BLOCK_N > Lk:
            s = gl.where((j * BLOCK_N + cols < Lk)[None, :], s, float("-inf"))
        p = gl.exp2(s)
        dp = warpgroup_mma_wait(0, deps=[dp_tok])
        ds_a = gl.convert_layout((p * (dp - delta[:, None])).to(dtype), a_layout)
        dq_tok = warpgroup_mma(ds_a, k_tile, dq, is_async=True)
        dq, ds_a = warpgroup_mma_wait(0, deps=[dq_tok, ds_a])
        mbarrier.arrive(empty_bars.index(slot), count=1)

    rows = row_start + gl.arange(0, QROWS, layout=gl.SliceLayout(1, g_layout))
    dcols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, g_layout))
    offs = b.to(gl.int64) * stride_qb + h.to(gl.int64) * stride_qh + rows.to(gl.int64)[:, None] * stride_ql
    gl.store(DQ + offs + dcols[None, :], (dq * scale).to(dtype), mask=(rows < Lq)[:, None])


@gluon.jit
def _dq_kernel(
    q_desc, k_desc, v_desc, do_desc, LSE, DELTA, DQ, scale, qk_scale,
    stride_qb, stride_qh, stride_ql, H, Lq, Lk,
    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
):  # fmt: skip
    dtype: gl.constexpr = q_desc.dtype
    n_m = gl.cdiv(Lq, 128)
    pid = gl.program_id(0)
    pid_bh = pid // n_m
    row_start = (pid % n_m) * 128
    b = pid_bh // H
    h = pid_bh % H
    n_tiles = gl.cdiv(Lk, BLOCK_N)

    q_bufs = gl.allocate_shared_memory(dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    do_bufs = gl.allocate_shared_memory(dtype, [2] + do_desc.block_type.shape, do_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    qd_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ready_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(qd_bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready_bars.index(i), count=1)
        mbarrier.init(empty_bars.index(i), count=2)

    gl.warp_specialize(
        [
            (_dq_compute, (q_bufs.index(0), do_bufs.index(0), qd_bars.index(0), k_bufs, v_bufs, ready_bars, empty_bars,
                           LSE, DELTA, DQ, scale, qk_scale, stride_qb, stride_qh, stride_ql, b, h, pid_bh, row_start,
                           Lq, Lk, n_tiles)),
            (_dq_compute, (q_bufs.index(1), do_bufs.index(1), qd_bars.index(1), k_bufs, v_bufs, ready_bars, empty_bars,
                           LSE, DELTA, DQ, scale, qk_scale, stride_qb, stride_qh, stride_ql, b, h, pid_bh,
                           row_start + 64, Lq, Lk, n_tiles)),
            (_dq_load, (q_desc, do_desc, k_desc, v_desc, q_bufs, do_bufs, k_bufs, v_bufs, qd_bars, ready_bars,
                        empty_bars, b, h, row_start, n_tiles, BLOCK_N, STAGES)),
        ],
        [4, 1],
        [168, 24],
    )  # fmt: skip


# (BLOCK_M of the dK/dV kernel's query tiles, BLOCK_N of the dQ kernel's key tiles, STAGES), per D.
# 64-row tiles: with 128 the dQ kernel's S and dP spill (384 bytes a thread in the sm_90a build).
CONFIGS = {64: (64, 64, 2)}


def config_string(kernel: str, head_dim: int) -> str:
    """The config of the ``kernel`` ("dkdv" or "dq") launch at ``head_dim``, as rows record it."""
    block_m, block_n, stages = CONFIGS[head_dim]
    tiles = (
        f"BLOCK_N={ROWS * WARPGROUPS},BLOCK_M={block_m}"
        if kernel == "dkdv"
        else f"BLOCK_M={ROWS * WARPGROUPS},BLOCK_N={block_n}"
    )
    return f"gluon:{tiles},stages={stages},warpgroups={WARPGROUPS}+load"


_LAUNCHES = LaunchCache(first_launch)


def backward(q, k, v, lse, do, delta, dq, grads, scale: float) -> None:
    """dQ into ``dq`` and dK, dV into ``grads`` (2, B, H, Lk, D), for inputs ``forward_hopper`` takes;
    ``delta`` is Δ (B, H, Lq) float32, ``lse`` the forward's (B, H, Lq) float32."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    block_m, block_n, stages = CONFIGS[D]
    qk_scale = float(scale * LOG2E)
    key_desc = (descriptor(k, ROWS), descriptor(v, ROWS))
    launch(
        _LAUNCHES,
        _dkdv_kernel,
        (triton.cdiv(Lk, ROWS * WARPGROUPS) * B * H,),
        (descriptor(q, block_m), *key_desc, descriptor(do, block_m), lse, delta, grads),
        (
            float(scale),
            qk_scale,
            grads.stride(0),
            grads.stride(1),
            grads.stride(2),
            grads.stride(3),
            H,
            Lq,
            Lk,
        ),
        {"HEAD_DIM": D, "BLOCK_M": block_m, "STAGES": stages, "num_warps": 4},
        key_tensors=(q, k, v, do, grads),
    )
    launch(
        _LAUNCHES,
        _dq_kernel,
        (triton.cdiv(Lq, ROWS * WARPGROUPS) * B * H,),
        (
            descriptor(q, ROWS),
            descriptor(k, block_n),
            descriptor(v, block_n),
            descriptor(do, ROWS),
            lse,
            delta,
            dq,
        ),
        (float(scale), qk_scale, dq.stride(0), dq.stride(1), dq.stride(2), H, Lq, Lk),
        {"HEAD_DIM": D, "BLOCK_N": block_n, "STAGES": stages, "num_warps": 4},
        key_tensors=(q, k, v, do, dq),
    )


__all__ = ["CONFIGS", "backward", "config_string"]
