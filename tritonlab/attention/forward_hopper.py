"""The attention forward on Hopper in Gluon: the next tile's scores on the tensor cores while this
tile's softmax runs.

    o = softmax(scale · q kᵀ) v,   lse = logsumexp(scale · q kᵀ)   (natural log, per query row)

The same online softmax as ``forward.py`` (running max ``m`` and sum ``l`` in the base-2 domain,
scale·log2(e) folded into one multiply), written in Gluon (``triton.experimental.gluon``), where the
kernel states what Triton's compiler decides for itself: the shared-memory ring K and V arrive in
(TMA copies, one mbarrier per buffer), the layouts, and when each warpgroup MMA is awaited.

Why: at D = 64 a 128 x 128 tile's two products take as many SM cycles on the tensor cores as its
16 384 exponentials take on the exponential unit, and the Triton loop issues them in turn. Here
iteration j issues S_j = Q K_jᵀ and O += P_{j-1} V_{j-1} asynchronously, waits for S_j only, and
computes P_j's softmax while the P V product is still on the tensor cores (FlashAttention-3's
intra-warpgroup overlap). P stays in registers as the MMA's A operand.

Addressing: host-side 4-D tensor descriptors over (B, H, L, D) with the caller's strides, so the
model's strided q, k, v are read in place and every out-of-range row (past Lq or Lk of this head)
reads as zeros; the score columns past Lk are masked to -inf on the last tile only.

Hopper only (sm_90), 16-bit inputs, D in 64 or 128, TMA-addressable strides; ``supported`` says
whether a call qualifies. Gluon kernels do not run in Triton's interpreter: ``forward.py`` stays the
path everywhere else, and this kernel is tested on the GPU (and built for sm_90 on the CPU).
"""

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .._launch import tma_ok

GLUON_HEAD_DIMS = (64, 128)


@gluon.jit
def _issue_kv(k_desc, v_desc, k_bufs, v_bufs, k_bars, v_bars, b, h, tile, n_tiles, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr):  # fmt: skip
    # K and V of one tile into ring slot tile % STAGES, each on its own barrier, so that Q Kᵀ can
    # start before V has landed; no copy for tiles past the end.
    slot = tile % STAGES
    pred = tile < n_tiles
    mbarrier.expect(k_bars.index(slot), k_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(k_desc, [b, h, tile * BLOCK_N, 0], k_bars.index(slot), k_bufs.index(slot), pred)
    mbarrier.expect(v_bars.index(slot), v_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(v_desc, [b, h, tile * BLOCK_N, 0], v_bars.index(slot), v_bufs.index(slot), pred)


@gluon.jit
def _attn_fwd_hopper_kernel(
    q_desc, k_desc, v_desc, O, LSE, qk_scale,
    stride_ob, stride_oh, stride_ol,
    H, Lq, Lk,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    num_warps: gl.constexpr,
):  # fmt: skip
    dtype: gl.constexpr = q_desc.dtype
    n_m = gl.cdiv(Lq, BLOCK_M)
    pid = gl.program_id(0)
    pid_bh = pid // n_m
    row_start = (pid % n_m) * BLOCK_M
    b = pid_bh // H
    h = pid_bh % H

    # Each warp owns 16 query rows of both accumulators; P converts to the A operand in registers.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    q_smem = gl.allocate_shared_memory(dtype, q_desc.block_type.shape, q_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)

    n_tiles = gl.cdiv(Lk, BLOCK_N)
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [b, h, row_start, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        _issue_kv(k_desc, v_desc, k_bufs, v_bufs, k_bars, v_bars, b, h, i, n_tiles, BLOCK_N, STAGES)

    q = q_smem.reshape([BLOCK_M, HEAD_DIM])
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, s_rows)
    l_i = gl.zeros([BLOCK_M], gl.float32, s_rows)

    # Tile 0: its scores, alone.
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bars.index(0), 0)
    s = warpgroup_mma(q, k_bufs.index(0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), s_zero, use_acc=False)
    if n_tiles == 1:
        s = gl.where((cols < Lk)[None, :], s, float("-inf"))
    m_i = gl.max(s, 1) * qk_scale
    p = gl.exp2(s * qk_scale - m_i[:, None])
    l_i = gl.sum(p, 1)
    p = gl.convert_layout(p.to(dtype), p_layout)

    for j in range(1, n_tiles):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        # S_j and O += P_{j-1} V_{j-1} on the tensor cores, in that order; wait for S_j alone.
        mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
        s_tok = warpgroup_mma(
            q, k_bufs.index(slot).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), s_zero, use_acc=False, is_async=True
        )
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        o_tok = warpgroup_mma(p, v_bufs.index(prev).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        if (j + 1) * BLOCK_N > Lk:
            s = gl.where((j * BLOCK_N + cols < Lk)[None, :], s, float("-inf"))
        # P_j's softmax while the P V product runs.
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        p_new = gl.exp2(s * qk_scale - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p_new, 1)
        m_i = m_new
        acc, p = warpgroup_mma_wait(0, deps=[o_tok, p])
        acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
        p = gl.convert_layout(p_new.to(dtype), p_layout)
        # Slot prev is free (both its products are done): the tile STAGES ahead of j - 1 goes there.
        _issue_kv(k_desc, v_desc, k_bufs, v_bufs, k_bars, v_bars, b, h, j - 1 + STAGES, n_tiles, BLOCK_N, STAGES)

    last = (n_tiles - 1) % STAGES
    mbarrier.wait(v_bars.index(last), ((n_tiles - 1) // STAGES) & 1)
    acc = warpgroup_mma(p, v_bufs.index(last).reshape([BLOCK_N, HEAD_DIM]), acc)

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))

    acc = acc / gl.convert_layout(l_i, o_rows)[:, None]
    rows = row_start + gl.arange(0, BLOCK_M, layout=s_rows)
    # lse in natural log of the scaled scores: m and l live in base 2.
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
    gl.store(LSE + pid_bh.to(gl.int64) * Lq + rows, lse, mask=rows < Lq)
    o_rows_idx = row_start + gl.arange(0, BLOCK_M, layout=o_rows)
    o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    o_ptrs = (
        O
        + b.to(gl.int64) * stride_ob
        + h.to(gl.int64) * stride_oh
        + o_rows_idx.to(gl.int64)[:, None] * stride_ol
        + o_cols[None, :]
    )
    gl.store(o_ptrs, acc.to(dtype), mask=(o_rows_idx < Lq)[:, None])


def _gl_dtype(dtype: torch.dtype):
    return {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[dtype]


def descriptor(t: torch.Tensor, block_rows: int) -> TensorDescriptor:
    """A (B, H, L, D) tensor's TMA descriptor, tiles of ``block_rows`` rows of one head."""
    block = [1, 1, block_rows, t.shape[-1]]
    layout = gl.NVMMASharedLayout.get_default_for(block, _gl_dtype(t.dtype))
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether this kernel takes the call: a Hopper GPU, bf16/fp16, D in 64 or 128, TMA strides."""
    return (
        q.is_cuda
        and torch.cuda.get_device_capability(q.device)[0] == 9
        and q.dtype in (torch.bfloat16, torch.float16)
        and q.shape[-1] in GLUON_HEAD_DIMS
        and tma_ok(q, k, v)
    )


def launch(q, k, v, o, lse, qk_scale: float, block_m: int = 128, block_n: int = 128, stages: int = 3, warps: int = 8):
    """One launch of the kernel on already-checked inputs and allocated outputs."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    grid = (triton.cdiv(Lq, block_m) * B * H,)
    return _attn_fwd_hopper_kernel[grid](
        descriptor(q, block_m),
        descriptor(k, block_n),
        descriptor(v, block_n),
        o,
        lse,
        qk_scale,
        o.stride(0),
        o.stride(1),
        o.stride(2),
        H,
        Lq,
        Lk,
        HEAD_DIM=D,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        STAGES=stages,
        num_warps=warps,
    )


# --- v2: warp-specialised: one loader warp, NUM_CONSUMERS warpgroups of 64 query rows each ---------


@gluon.jit
def _ws_loader(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bars, k_bars, v_bars, empty_bars, b, h, row_start,
               n_tiles, BLOCK_N: gl.constexpr, ROWS: gl.constexpr, NUM_CONSUMERS: gl.constexpr,
               STAGES: gl.constexpr):  # fmt: skip
    for c in gl.static_range(NUM_CONSUMERS):
        mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, row_start + c * ROWS, 0], q_bars.index(c), q_bufs.index(c))
    for j in range(n_tiles):
        slot = j % STAGES
        # The slot's previous tile must be released by every consumer first.
        mbarrier.wait(empty_bars.index(slot), ((j // STAGES) + 1) & 1, pred=j >= STAGES)
        mbarrier.expect(k_bars.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [b, h, j * BLOCK_N, 0], k_bars.index(slot), k_bufs.index(slot))
        mbarrier.expect(v_bars.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [b, h, j * BLOCK_N, 0], v_bars.index(slot), v_bufs.index(slot))


@gluon.jit
def _ws_consumer(q_bufs, k_bufs, v_bufs, q_bars, k_bars, v_bars, empty_bars, O, LSE, qk_scale, stride_ob, stride_oh,
                 stride_ol, b, h, pid_bh, row_start, Lq, Lk, n_tiles, WHICH: gl.constexpr, HEAD_DIM: gl.constexpr,
                 ROWS: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    dtype: gl.constexpr = k_bufs.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    row_start = row_start + WHICH * ROWS

    q = q_bufs.index(WHICH).reshape([ROWS, HEAD_DIM])
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)

    mbarrier.wait(q_bars.index(WHICH), 0)
    mbarrier.wait(k_bars.index(0), 0)
    s = warpgroup_mma(q, k_bufs.index(0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), s_zero, use_acc=False)
    if n_tiles == 1:
        s = gl.where((cols < Lk)[None, :], s, float("-inf"))
    m_i = gl.max(s, 1) * qk_scale
    p = gl.exp2(s * qk_scale - m_i[:, None])
    l_i = gl.sum(p, 1)
    p = gl.convert_layout(p.to(dtype), p_layout)

    for j in range(1, n_tiles):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
        s_tok = warpgroup_mma(
            q, k_bufs.index(slot).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), s_zero, use_acc=False, is_async=True
        )
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        o_tok = warpgroup_mma(p, v_bufs.index(prev).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        if (j + 1) * BLOCK_N > Lk:
            s = gl.where((j * BLOCK_N + cols < Lk)[None, :], s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        p_new = gl.exp2(s * qk_scale - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p_new, 1)
        m_i = m_new
        acc, p = warpgroup_mma_wait(0, deps=[o_tok, p])
        mbarrier.arrive(empty_bars.index(prev), count=1)
        acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
        p = gl.convert_layout(p_new.to(dtype), p_layout)

    last = (n_tiles - 1) % STAGES
    mbarrier.wait(v_bars.index(last), ((n_tiles - 1) // STAGES) & 1)
    acc = warpgroup_mma(p, v_bufs.index(last).reshape([BLOCK_N, HEAD_DIM]), acc)

    acc = acc / gl.convert_layout(l_i, o_rows)[:, None]
    rows = row_start + gl.arange(0, ROWS, layout=s_rows)
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
    gl.store(LSE + pid_bh.to(gl.int64) * Lq + rows, lse, mask=rows < Lq)
    o_rows_idx = row_start + gl.arange(0, ROWS, layout=o_rows)
    o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    o_ptrs = (
        O
        + b.to(gl.int64) * stride_ob
        + h.to(gl.int64) * stride_oh
        + o_rows_idx.to(gl.int64)[:, None] * stride_ol
        + o_cols[None, :]
    )
    gl.store(o_ptrs, acc.to(dtype), mask=(o_rows_idx < Lq)[:, None])


@gluon.jit
def _attn_fwd_ws_kernel(
    q_desc, k_desc, v_desc, O, LSE, qk_scale,
    stride_ob, stride_oh, stride_ol,
    H, Lq, Lk,
    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, NUM_CONSUMERS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr,
):  # fmt: skip
    ROWS: gl.constexpr = 64
    BLOCK_M: gl.constexpr = ROWS * NUM_CONSUMERS
    dtype: gl.constexpr = q_desc.dtype
    n_m = gl.cdiv(Lq, BLOCK_M)
    pid = gl.program_id(0)
    pid_bh = pid // n_m
    row_start = (pid % n_m) * BLOCK_M
    b = pid_bh // H
    h = pid_bh % H
    n_tiles = gl.cdiv(Lk, BLOCK_N)

    q_bufs = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_CONSUMERS):
        mbarrier.init(q_bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
        mbarrier.init(empty_bars.index(i), count=NUM_CONSUMERS)

    gl.static_assert(NUM_CONSUMERS == 2 or NUM_CONSUMERS == 3, "two or three consumer warpgroups")
    if NUM_CONSUMERS == 2:
        gl.warp_specialize(
            [
                (_ws_consumer, (q_bufs, k_bufs, v_bufs, q_bars, k_bars, v_bars, empty_bars, O, LSE, qk_scale, stride_ob,
                                stride_oh, stride_ol, b, h, pid_bh, row_start, Lq, Lk, n_tiles, 0, HEAD_DIM, ROWS,
                                BLOCK_N, STAGES)),
                (_ws_consumer, (q_bufs, k_bufs, v_bufs, q_bars, k_bars, v_bars, empty_bars, O, LSE, qk_scale, stride_ob,
                                stride_oh, stride_ol, b, h, pid_bh, row_start, Lq, Lk, n_tiles, 1, HEAD_DIM, ROWS,
                                BLOCK_N, STAGES)),
                (_ws_loader, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bars, k_bars, v_bars, empty_bars, b, h,
                              row_start, n_tiles, BLOCK_N, ROWS, NUM_CONSUMERS, STAGES)),
            ],
            [4, 1],
            [CONSUMER_REGS, LOADER_REGS],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [
                (_ws_consumer, (q_bufs, k_bufs, v_bufs, q_bars, k_bars, v_bars, empty_bars, O, LSE, qk_scale, stride_ob,
                                stride_oh, stride_ol, b, h, pid_bh, row_start, Lq, Lk, n_tiles, 0, HEAD_DIM, ROWS,
                                BLOCK_N, STAGES)),
                (_ws_consumer, (q_bufs, k_bufs, v_bufs, q_bars, k_bars, v_bars, empty_bars, O, LSE, qk_scale, stride_ob,
                                stride_oh, stride_ol, b, h, pid_bh, row_start, Lq, Lk, n_tiles, 1, HEAD_DIM, ROWS,
                                BLOCK_N, STAGES)),
                (_ws_consumer, (q_bufs, k_bufs, v_bufs, q_bars, k_bars, v_bars, empty_bars, O, LSE, qk_scale, stride_ob,
                                stride_oh, stride_ol, b, h, pid_bh, row_start, Lq, Lk, n_tiles, 2, HEAD_DIM, ROWS,
                                BLOCK_N, STAGES)),
                (_ws_loader, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bars, k_bars, v_bars, empty_bars, b, h,
                              row_start, n_tiles, BLOCK_N, ROWS, NUM_CONSUMERS, STAGES)),
            ],
            [4, 4, 1],
            [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS],
        )  # fmt: skip


def launch_ws(q, k, v, o, lse, qk_scale: float, block_n: int = 128, stages: int = 2, consumers: int = 3,
              consumer_regs: int = 160, loader_regs: int = 24):  # fmt: skip
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    grid = (triton.cdiv(Lq, 64 * consumers) * B * H,)
    return _attn_fwd_ws_kernel[grid](
        descriptor(q, 64), descriptor(k, block_n), descriptor(v, block_n), o, lse, qk_scale,
        o.stride(0), o.stride(1), o.stride(2), H, Lq, Lk,
        HEAD_DIM=D, BLOCK_N=block_n, STAGES=stages, NUM_CONSUMERS=consumers,
        CONSUMER_REGS=consumer_regs, LOADER_REGS=loader_regs, num_warps=4,
    )  # fmt: skip
