"""The FP8 attention forward on Hopper in Gluon: ``fp8.py``'s math on ``forward_hopper.py``'s warps.

    o = softmax(scale · q kᵀ) v,   lse = logsumexp(scale · q kᵀ)   (natural log, per query row)

computed from e4m3 values exactly as ``fp8._fp8_fwd_kernel`` computes it -- K8, V8ᵀ, their
per-128-key scales and V's block means from ``fp8._quantize_kv``; Q quantised per block of query
rows inside the kernel; S = s_q·s_k·(Q8 K8ᵀ); P8 = e4m3(448·P); the accumulator kept in units of
the current tile's V scale; rowsum(P)·μ added in fp32 -- but with the warp roles of the bf16 Gluon
forward: a load warp streams K8 and V8ᵀ tiles into a STAGES-deep TMA ring, and three softmax
warpgroups of 64 query rows each issue S_j and O += P8_{j-1}·V8_{j-1} asynchronously and compute
P_j's softmax while the P·V product runs.

What FP8 changes against the bf16 kernel:

- each warpgroup quantises its own 64 query rows (one scale, amax/448, as ``fp8._quantize_tile``):
  the backward's dequantisation takes Q per block of ``ROWS_PER_WARPGROUP`` rows to match;
- both products take their A operand (Q8, P8) from registers and their B operand (K8, V8ᵀ) from
  shared memory, key-major as e4m3 ``wgmma`` requires: K8 is (keys, D) with D contiguous, V8ᵀ
  (D, keys) with the keys contiguous;
- the online softmax's rescale of the accumulator becomes one multiply-add per element a tile,
  ``acc · α·s_v,old/s_v,new + rowsum(P)·448/s_v,new · μ``: the change of V scale and V's block mean
  ride on the multiply the bf16 kernel does anyway. The tile's K scale, V scale and mean are read
  per tile (two scalars and D floats, L2-resident).

Hopper only (sm_90), bf16/fp16 q with TMA-addressable strides, D in 64 or 128
(``unsupported_reason``). Gluon kernels do not run in Triton's interpreter: ``fp8.py``'s Triton
kernel is the path everywhere else, and this one is tested on the GPU and built for sm_90a on the CPU.
"""

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .._launch import LaunchCache, first_launch, launch
from ..ops.fp8 import FP8_MAX
from . import forward_hopper
from .forward_hopper import ROWS_PER_WARPGROUP, SOFTMAX_WARPGROUPS

BLOCK_M = ROWS_PER_WARPGROUP * SOFTMAX_WARPGROUPS
_E4M3_MAX = gl.constexpr(FP8_MAX)


@gluon.constexpr_function
def fp8_mma_layout(n):
    """A warpgroup's accumulator layout for 64 x n results of e4m3 products (k = 32 per instruction)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 32])


@gluon.jit
def _load_partition(q_desc, k_desc, v_desc, m_desc, KS, VS, q_bufs, k_bufs, v_bufs, m_bufs, sc_bufs, q_bars,
                    k_bars, v_bars, empty_bars, b, h, pid_bh, row_start, n_tiles, n_kv_blocks, BLOCK_N: gl.constexpr,
                    ROWS: gl.constexpr, NUM_CONSUMERS: gl.constexpr, STAGES: gl.constexpr,
                    KV_BLOCK: gl.constexpr):  # fmt: skip
    # forward_hopper's load warp, for K8 (B, H, L', D) and V8ᵀ (B, H, D, L') tiles, with each K8 tile
    # its block's K and V scales (loaded a tile ahead, stored before the K barrier's arrive releases
    # them) and with each V8ᵀ tile its block's means (B, H, L'/KV_BLOCK, D). In shared memory they
    # cost the softmax warps neither registers for addresses nor a global load's latency.
    pair = gl.arange(0, 2, layout=gl.BlockedLayout([2], [32], [1], [0]))
    first = pid_bh.to(gl.int64) * n_kv_blocks
    scales = gl.load(gl.where(pair == 0, KS + first, VS + first))
    for c in gl.static_range(NUM_CONSUMERS):
        mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            q_desc, [b, h, row_start + c * ROWS, 0], q_bars.index(c), q_bufs.index(c)
        )
    for j in range(n_tiles):
        slot = j % STAGES
        # The slot's previous tile must be released by every consumer first.
        mbarrier.wait(empty_bars.index(slot), ((j // STAGES) + 1) & 1, pred=j >= STAGES)
        sc_bufs.index(slot).store(scales)
        mbarrier.expect(k_bars.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            k_desc, [b, h, j * BLOCK_N, 0], k_bars.index(slot), k_bufs.index(slot)
        )
        mbarrier.expect(v_bars.index(slot), v_desc.block_type.nbytes + m_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            v_desc, [b, h, 0, j * BLOCK_N], v_bars.index(slot), v_bufs.index(slot)
        )
        tma.async_copy_global_to_shared(
            m_desc, [b, h, (j * BLOCK_N) // KV_BLOCK, 0], v_bars.index(slot), m_bufs.index(slot)
        )
        block = first + (gl.minimum(j + 1, n_tiles - 1) * BLOCK_N) // KV_BLOCK
        scales = gl.load(gl.where(pair == 0, KS + block, VS + block))


@gluon.jit
def _scales(sc_smem, pair):
    """The tile's (K scale, V scale) from the pair the load warp stored."""
    sc = sc_smem.load(pair.type.layout)
    return gl.sum(gl.where(pair == 0, sc, 0.0), 0), gl.sum(gl.where(pair == 1, sc, 0.0), 0)


@gluon.jit
def _as_operand(p8, layout: gl.constexpr):
    """P8 from the accumulator layout to the A-operand layout with its columns reordered within
    each 32 (``KEY_ORDER``): the order in which each thread already holds them, so the move stays in
    registers (byte permutes, no shuffles); V8ᵀ's keys are stored in the same order."""
    ROWS: gl.constexpr = p8.shape[0]
    N: gl.constexpr = p8.shape[1]
    p8 = gl.permute(gl.reshape(p8, [ROWS, N // 32, 2, 2, 4, 2]), (0, 1, 2, 4, 3, 5))
    return gl.convert_layout(gl.reshape(p8, [ROWS, N]), layout)


@gluon.jit
def _fp8_softmax_partition(q_smem, q8_smem, q_bar, k_bufs, v_bufs, m_bufs, sc_bufs, k_bars, v_bars, empty_bars, O,
                           LSE, qk_scale, stride_ob, stride_oh, stride_ol, b, h, pid_bh, row_start, Lq, Lk,
                           n_tiles):  # fmt: skip
    # One warpgroup's 64 query rows from row_start; the tile sizes come with the buffers' types.
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    HEAD_DIM: gl.constexpr = k_bufs.shape[4]
    ROWS: gl.constexpr = q_smem.shape[2]
    dtype: gl.constexpr = q_smem.dtype
    fp8: gl.constexpr = k_bufs.dtype
    s_layout: gl.constexpr = fp8_mma_layout(BLOCK_N)
    o_layout: gl.constexpr = fp8_mma_layout(HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    load_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    # The warpgroup's Q rows to e4m3 with one scale, as fp8._quantize_tile (rows past Lq read as 0).
    mbarrier.wait(q_bar, 0)
    q = q_smem.reshape([ROWS, HEAD_DIM]).load(load_layout).to(gl.float32)
    amax = gl.max(gl.max(gl.abs(q), 1), 0)
    q_scale = gl.where(amax > 0.0, amax / _E4M3_MAX, 1.0)  # as fp8._quantize_tile rounds it
    q8_smem.store((q * (1.0 / q_scale)).to(fp8))
    fence_async_shared()
    row_scale = qk_scale * q_scale

    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    pair = gl.arange(0, 2, layout=gl.BlockedLayout([2], [32], [4], [0]))

    mbarrier.wait(k_bars.index(0), 0)
    s = warpgroup_mma(
        q8_smem, k_bufs.index(0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), s_zero, use_acc=False
    )
    if n_tiles == 1:
        s = gl.where((cols < Lk)[None, :], s, float("-inf"))
    k_scale, v_unit = _scales(sc_bufs.index(0), pair)
    score_scale = row_scale * k_scale
    m_i = gl.max(s, 1) * score_scale
    p = gl.exp2(s * score_scale - m_i[:, None])
    l_i = gl.sum(p, 1)
    # rowsum(P)·448/s_v: the weight of the tile's V means, added once its P·V product is in acc.
    mean_weight = l_i * gl.fdiv(_E4M3_MAX, v_unit)
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
    p8 = _as_operand((p * _E4M3_MAX).to(fp8), p_layout)

    for j in range(1, n_tiles):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
        k_scale, v_scale = _scales(sc_bufs.index(slot), pair)
        k_tile = k_bufs.index(slot).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
        s_tok = warpgroup_mma(q8_smem, k_tile, s_zero, use_acc=False, is_async=True)
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        v_tile = v_bufs.index(prev).reshape([HEAD_DIM, BLOCK_N]).permute((1, 0))
        o_tok = warpgroup_mma(p8, v_tile, acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        if (j + 1) * BLOCK_N > Lk:
            s = gl.where((j * BLOCK_N + cols < Lk)[None, :], s, float("-inf"))
        score_scale = row_scale * k_scale
        m_new = gl.maximum(m_i, gl.max(s, 1) * score_scale)
        p_new = gl.exp2(s * score_scale - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        p_sum = gl.sum(p_new, 1)
        l_i = l_i * alpha + p_sum
        m_i = m_new
        # acc (tiles < j, units of the previous tile's V scale) plus the previous tile's means, under
        # the new max and in units of this tile's V scale: one multiply-add per element.
        rescale = alpha * gl.fdiv(v_unit, v_scale)
        mean_coef = gl.convert_layout(mean_weight * rescale, o_rows)
        rescale = gl.convert_layout(rescale, o_rows)
        mean_weight = p_sum * gl.fdiv(_E4M3_MAX, v_scale)
        v_unit = v_scale
        acc = warpgroup_mma_wait(0, deps=[o_tok])
        v_mean = m_bufs.index(prev).reshape([1, HEAD_DIM]).load(o_layout)
        mbarrier.arrive(empty_bars.index(prev), count=1)
        acc = acc * rescale[:, None] + mean_coef[:, None] * v_mean
        p8 = _as_operand((p_new * _E4M3_MAX).to(fp8), p_layout)

    last = (n_tiles - 1) % STAGES
    mbarrier.wait(v_bars.index(last), ((n_tiles - 1) // STAGES) & 1)
    acc = warpgroup_mma(p8, v_bufs.index(last).reshape([HEAD_DIM, BLOCK_N]).permute((1, 0)), acc)
    v_mean = m_bufs.index(last).reshape([1, HEAD_DIM]).load(o_layout)
    acc = acc + gl.convert_layout(mean_weight, o_rows)[:, None] * v_mean

    acc = acc * gl.convert_layout((v_unit / _E4M3_MAX) / l_i, o_rows)[:, None]
    rows = row_start + gl.arange(0, ROWS, layout=s_rows)
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
    gl.store(LSE + pid_bh.to(gl.int64) * Lq + rows, lse, mask=rows < Lq)
    o_rows_idx = row_start + gl.arange(0, ROWS, layout=o_rows)
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    o_ptrs = (
        O
        + b.to(gl.int64) * stride_ob
        + h.to(gl.int64) * stride_oh
        + o_rows_idx.to(gl.int64)[:, None] * stride_ol
        + dims[None, :]
    )
    gl.store(o_ptrs, acc.to(dtype), mask=(o_rows_idx < Lq)[:, None])


@gluon.jit
def _fp8_attn_fwd_hopper_kernel(
    q_desc, k_desc, v_desc, m_desc, KS, VS, O, LSE, qk_scale,
    stride_ob, stride_oh, stride_ol,
    H, Lq, Lk, n_kv_blocks,
    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, KV_BLOCK: gl.constexpr,
):  # fmt: skip
    ROWS: gl.constexpr = q_desc.block_type.shape[2]  # one warpgroup's rows: ROWS_PER_WARPGROUP
    NUM_CONSUMERS: gl.constexpr = 3  # the three softmax partitions below: SOFTMAX_WARPGROUPS
    BLOCK_M: gl.constexpr = ROWS * NUM_CONSUMERS
    n_m = gl.cdiv(Lq, BLOCK_M)
    pid = gl.program_id(0)
    pid_bh = pid // n_m
    row_start = (pid % n_m) * BLOCK_M
    b = pid_bh // H
    h = pid_bh % H
    n_tiles = gl.cdiv(Lk, BLOCK_N)

    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [NUM_CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
    q8_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, HEAD_DIM], k_desc.dtype)
    q8_bufs = gl.allocate_shared_memory(k_desc.dtype, [NUM_CONSUMERS, ROWS, HEAD_DIM], q8_layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    m_bufs = gl.allocate_shared_memory(m_desc.dtype, [STAGES] + m_desc.block_type.shape, m_desc.layout)
    sc_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, 2], gl.SwizzledSharedLayout(1, 1, 1, [0]))
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

    gl.warp_specialize(
        [
            (_fp8_softmax_partition, (q_bufs.index(0), q8_bufs.index(0), q_bars.index(0), k_bufs, v_bufs, m_bufs, sc_bufs, k_bars,
                                      v_bars, empty_bars, O, LSE, qk_scale, stride_ob, stride_oh, stride_ol, b, h, pid_bh,
                                      row_start, Lq, Lk, n_tiles)),
            (_fp8_softmax_partition, (q_bufs.index(1), q8_bufs.index(1), q_bars.index(1), k_bufs, v_bufs, m_bufs, sc_bufs, k_bars,
                                      v_bars, empty_bars, O, LSE, qk_scale, stride_ob, stride_oh, stride_ol, b, h, pid_bh,
                                      row_start + ROWS, Lq, Lk, n_tiles)),
            (_fp8_softmax_partition, (q_bufs.index(2), q8_bufs.index(2), q_bars.index(2), k_bufs, v_bufs, m_bufs, sc_bufs, k_bars,
                                      v_bars, empty_bars, O, LSE, qk_scale, stride_ob, stride_oh, stride_ol, b, h, pid_bh,
                                      row_start + 2 * ROWS, Lq, Lk, n_tiles)),
            (_load_partition, (q_desc, k_desc, v_desc, m_desc, KS, VS, q_bufs, k_bufs, v_bufs, m_bufs, sc_bufs, q_bars,
                               k_bars, v_bars, empty_bars, b, h, pid_bh, row_start, n_tiles, n_kv_blocks, BLOCK_N, ROWS,
                               NUM_CONSUMERS, STAGES, KV_BLOCK)),
        ],
        [4, 4, 1],
        [160, 160, 24],
    )  # fmt: skip


# Per head dim: (BLOCK_N, STAGES). Every BLOCK_N divides fp8.KV_BLOCK, so a tile has one K/V scale.
CONFIGS = {64: (128, 3), 128: (64, 3)}


def _descriptor(t: torch.Tensor, block: list, layout) -> TensorDescriptor:
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)


def kv_descriptors(k8: torch.Tensor, v8t: torch.Tensor, v_means: torch.Tensor, B: int, H: int, block_n: int):
    """TMA descriptors of ``fp8._quantize_kv``'s K8 (B·H, Lk', D), V8ᵀ (B·H, D, Lk') and V means
    (B·H, Lk'/KV_BLOCK, D) as (B, H, ·, ·) views: tiles of ``block_n`` keys, (block_n, D) of K8 and
    (D, block_n) of V8ᵀ, and one block's means (1, D), unswizzled (the softmax warps read them as rows)."""
    k4, v4, m4 = (t.view(B, H, *t.shape[1:]) for t in (k8, v8t, v_means))
    D = k8.shape[2]
    k_block, v_block, m_block = [1, 1, block_n, D], [1, 1, D, block_n], [1, 1, 1, D]
    return (
        _descriptor(k4, k_block, gl.NVMMASharedLayout.get_default_for(k_block, gl.float8e4nv)),
        _descriptor(v4, v_block, gl.NVMMASharedLayout.get_default_for(v_block, gl.float8e4nv)),
        _descriptor(m4, m_block, gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=4)),
    )


def unsupported_reason(q: torch.Tensor) -> str | None:
    """Why this kernel cannot take q, or None: a Hopper GPU, bf16/fp16, D in 64 or 128 and strides
    a tensor descriptor can address (K8 and V8ᵀ are the quantisation's own, contiguous)."""
    return forward_hopper.unsupported_reason(q, q, q)


def config_string(head_dim: int) -> str:
    """The config a call at ``head_dim`` runs, as the benchmark rows record it."""
    block_n, stages = CONFIGS[head_dim]
    return f"gluon:BLOCK_M={BLOCK_M},BLOCK_N={block_n},stages={stages},warpgroups={SOFTMAX_WARPGROUPS}+load"


_LAUNCHES = LaunchCache(first_launch)


def forward(q, k8, k_scales, v8t, v_scales, v_means, o, lse, Lk: int, qk_scale: float, kv_block: int) -> None:
    """Write o and lse for a checked q (``unsupported_reason`` None) and ``fp8._quantize_kv``'s
    outputs for Lk keys quantised per ``kv_block``; ``qk_scale`` is the softmax scale times log2(e).
    Q is quantised per ROWS_PER_WARPGROUP rows."""
    B, H, Lq, D = q.shape
    block_n, stages = CONFIGS[D]
    grid = (triton.cdiv(Lq, BLOCK_M) * B * H,)
    descriptors = (
        forward_hopper.descriptor(q, ROWS_PER_WARPGROUP),
        *kv_descriptors(k8, v8t, v_means, B, H, block_n),
    )
    launch(
        _LAUNCHES,
        _fp8_attn_fwd_hopper_kernel,
        grid,
        (*descriptors, k_scales, v_scales, o, lse),
        (float(qk_scale), o.stride(0), o.stride(1), o.stride(2), H, Lq, Lk, k_scales.shape[1]),
        {"HEAD_DIM": D, "BLOCK_N": block_n, "STAGES": stages, "KV_BLOCK": kv_block, "num_warps": 4},
        key_tensors=(q, k8, v8t, v_means, o),
    )


__all__ = ["config_string", "forward", "unsupported_reason"]
