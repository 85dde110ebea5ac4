"""The FP8 (e4m3) attention forward on Hopper in Gluon: ``forward_hopper``'s warp-specialised kernel
with e4m3 products and per-block scales.

    o = softmax(scale · q kᵀ) v,   lse = logsumexp(scale · q kᵀ)   (natural log, per query row)

The arithmetic is ``fp8.py``'s (its module docstring states it in full): K and V arrive quantised
per block of ``KV_BLOCK`` keys by ``fp8._quantize_kv`` (K8 (B·H, Lk', D), V8ᵀ (B·H, D, Lk') less the
block's per-channel means, fp32 scales), Q is quantised per block of 64 query rows, S = s_q · s_k ·
Q8 K8ᵀ, P = exp2(S' − m) is multiplied as e4m3(448 · P) with V8, the block means come back as
rowsum(P) · μ, and the accumulator is kept in units of the current tile's V scale.

The schedule is ``forward_hopper``'s: a program owns 3 x 64 query rows; one load warp copies the
bf16 Q tiles once and K8, V8ᵀ tiles into a STAGES-deep ring (TMA); each softmax warpgroup issues
S_j = Q8 K8_jᵀ and O += P8_{j-1} V8_{j-1} asynchronously and waits for S_j alone. What is new:

- **Q quantised in the warpgroup.** A warpgroup reads its bf16 Q tile from shared memory once,
  takes its amax, and writes e4m3(Q / s_q) to a shared tile of its own that the S products read: the
  quantisation costs one pass over 64 x D values per program, no launch, no global memory.
- **Both products in e4m3.** Hopper's fp8 ``wgmma`` takes its B operand K-major from shared memory:
  K8's rows (D contiguous) for S, V8ᵀ's rows (keys contiguous) for P V. P8, the A operand, goes
  through a shared tile of the warpgroup's own (8 KB): from registers it needs a byte-shuffling
  layout conversion that spills 1 248 bytes a thread, and Triton 3.6 cannot keep an 8-bit register
  operand alive across a ``wgmma`` wait.
- **Scales off the critical path.** A tile's K scale, V scale and V means are read from global
  memory (L2) right after its S product is issued, so that their latency overlaps the products'
  (read a tile ahead, their registers spilled).
- **448 in the exponent.** P8 = e4m3(448 · P) is computed as exp2(S' − (m − log2 448)), and the
  row sums count 448 · P: no multiply a score.
- **Unmasked main loop.** The last tile, where Lk ends inside it, runs in a loop of its own.
- **Long rows in key chunks.** Hopper's e4m3 ``wgmma`` adds into its fp32 accumulator in reduced
  precision, so O's error grows with the key tiles one accumulator sums (9.2% at 3 125 tiles against
  5.5% at 781). Past ``MAX_SUM_TILES`` a query block runs as several programs over chunks of the
  keys, each writing its rows' o and base-2 logsumexp in float32, merged by
  ``forward_hopper.combine_parts``.

Measured on the H100 (phase 05, D = 64, the quantisation launch included): 1.17x / 1.36x cuDNN's
bf16 forward at mid / large and 1.03x / 1.10x ``forward_hopper``'s; at D = 128, 0.97x / 1.12x
cuDNN (large in two key chunks).

Hopper only (sm_90), D in 64 or 128, q TMA-addressable (``forward_hopper.unsupported_reason(q)``);
no causal mask.
Gluon kernels do not run in Triton's interpreter: ``fp8.py``'s Triton kernel is the path elsewhere,
and this one is tested on the GPU and built for sm_90a on the CPU.
"""

import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .._gluon import block_descriptor, shared_layout
from .._launch import LaunchCache, first_launch, launch
from .._runtime import cdiv
from ..ops import fp8 as ops_fp8
from .forward_hopper import (
    ROWS_PER_WARPGROUP,
    SOFTMAX_WARPGROUPS,
    combine_parts,
    descriptor,
    load_q_tiles,
    ring_barriers,
)

FP8_MAX = gl.constexpr(ops_fp8.FP8_MAX)  # e4m3's largest finite value, as the kernels see it
LOG2_FP8_MAX = gl.constexpr(math.log2(ops_fp8.FP8_MAX))
BLOCK_M = ROWS_PER_WARPGROUP * SOFTMAX_WARPGROUPS


@gluon.constexpr_function
def mma8_layout(n):
    """A warpgroup's accumulator layout for 64 x n results of e4m3 products (m16 x n x k32)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 32])


@gluon.constexpr_function
def rows_layout(head_dim):
    """A blocked layout over a warpgroup's 64 x head_dim tile, 8 consecutive elements a thread."""
    cols = head_dim // 8
    return gl.BlockedLayout([1, 8], [32 // cols, cols], [4, 1], [1, 0])


@gluon.jit
def _fp8_load_partition(q_desc, k_desc, vt_desc, q_bufs, k_bufs, v_bufs, q_bars, k_bars, v_bars, empty_bars, b, h,
                        bh, row_start, n_tiles, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, t0=0,
                        SPLIT_KV: gl.constexpr = False):  # fmt: skip
    load_q_tiles(q_desc, q_bufs, q_bars, b, h, row_start)
    # K8 and V8ᵀ are (B·H, Lk', D) and (B·H, D, Lk'): V's tile starts at column j·BLOCK_N.
    for j in range(n_tiles):
        slot = j % STAGES
        # The slot's previous tile must be released by every consumer first.
        mbarrier.wait(empty_bars.index(slot), ((j // STAGES) + 1) & 1, pred=j >= STAGES)
        mbarrier.expect(k_bars.index(slot), k_desc.block_type.nbytes)
        # A key chunk's tiles from t0, behind a constant: the one-chunk build stays as timed.
        key = (t0 + j) * BLOCK_N if SPLIT_KV else j * BLOCK_N
        tma.async_copy_global_to_shared(k_desc, [bh, key, 0], k_bars.index(slot), k_bufs.index(slot))
        mbarrier.expect(v_bars.index(slot), vt_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(vt_desc, [bh, 0, key], v_bars.index(slot), v_bufs.index(slot))


@gluon.jit
def _quantized_q(q_smem, q8_smem, q_bar):
    """Writes e4m3(Q / s_q) of the warpgroup's bf16 Q tile into ``q8_smem``; returns s_q = amax/448
    (1 for an all-zero tile), ``fp8._quantize_tile``'s arithmetic."""
    ROWS: gl.constexpr = q8_smem.shape[0]
    HEAD_DIM: gl.constexpr = q8_smem.shape[1]
    mbarrier.wait(q_bar, 0)
    q = q_smem.reshape([ROWS, HEAD_DIM]).load(rows_layout(HEAD_DIM)).to(gl.float32)
    amax = gl.max(gl.max(gl.abs(q), 1), 0)
    q_scale = gl.where(amax > 0.0, amax / FP8_MAX, 1.0)
    q8_smem.store((q * (1.0 / q_scale)).to(gl.float8e4nv))
    fence_async_shared()
    return q_scale


@gluon.jit
def _block_scales(KS, VS, VM, bh, n_blocks, j, BLOCK_N: gl.constexpr, KV_BLOCK: gl.constexpr, mean_cols):
    """Ring tile ``j``'s K scale, V scale and V block means (fp32, ``mean_cols``' layout)."""
    blk = bh.to(gl.int64) * n_blocks + (j * BLOCK_N) // KV_BLOCK
    return gl.load(KS + blk), gl.load(VS + blk), gl.load(VM + blk * mean_cols.shape[0] + mean_cols)


@gluon.jit
def _fp8_tile(j, q8_smem, p_smem, acc, m_i, l_i, v_unit, k_bufs, v_bufs, k_bars, v_bars, empty_bars, KS, VS, VM,
              row_scale, bh, n_blocks, Lk, mean_cols, t0, KV_BLOCK: gl.constexpr, MASKED: gl.constexpr,
              SPLIT_KV: gl.constexpr):  # fmt: skip
    """Ring tile ``j``: issues S_j = Q8 K8_jᵀ and O += P8_{j-1} V8_{j-1}, waits for S_j, folds it into
    the online softmax (``MASKED``: keys past Lk to -inf first), then waits for the P V product,
    releases its slot, rescales O into tile j's V units, adds tile j's means and stores P8_j."""
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[2]
    HEAD_DIM: gl.constexpr = k_bufs.shape[3]
    ROWS: gl.constexpr = q8_smem.shape[0]
    s_layout: gl.constexpr = mma8_layout(BLOCK_N)
    o_rows: gl.constexpr = gl.SliceLayout(1, mma8_layout(HEAD_DIM))
    slot = j % STAGES
    prev = (j - 1) % STAGES
    mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
    s_tok = warpgroup_mma(
        q8_smem,
        k_bufs.index(slot).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)),
        gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout),
        use_acc=False,
        is_async=True,
    )
    tile = j
    if SPLIT_KV:  # ring tile j is key tile t0 + j
        tile = t0 + j
    # Read while the products run: used once S lands (K's) and after P V (V's).
    k_scale, v_scale, v_mean = _block_scales(KS, VS, VM, bh, n_blocks, tile, BLOCK_N, KV_BLOCK, mean_cols)
    mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
    o_tok = warpgroup_mma(
        p_smem, v_bufs.index(prev).reshape([HEAD_DIM, BLOCK_N]).permute((1, 0)), acc, is_async=True
    )
    s = warpgroup_mma_wait(1, deps=[s_tok])
    if MASKED:
        cols = tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s = gl.where((cols < Lk)[None, :], s, float("-inf"))
    score_scale = row_scale * k_scale
    m_new = gl.maximum(m_i, gl.max(s, 1) * score_scale)
    p = gl.exp2(s * score_scale - (m_new - LOG2_FP8_MAX)[:, None])  # 448 · P, what e4m3 takes
    alpha = gl.exp2(m_i - m_new)
    p_sum = gl.sum(p, 1)
    l_i = l_i * alpha + p_sum
    rescale = gl.convert_layout(alpha * (v_unit / v_scale), o_rows)
    mean_weight = gl.convert_layout(p_sum * (1.0 / v_scale), o_rows)
    acc = warpgroup_mma_wait(0, deps=[o_tok])
    mbarrier.arrive(empty_bars.index(prev), count=1)
    acc = acc * rescale[:, None] + mean_weight[:, None] * v_mean[None, :]
    p_smem.store(p.to(gl.float8e4nv))  # its last reader, P V of tile j - 1, is done
    fence_async_shared()
    return acc, m_new, l_i, v_scale


@gluon.jit
def _fp8_softmax_partition(q_smem, q8_smem, p_smem, q_bar, k_bufs, v_bufs, k_bars, v_bars, empty_bars, KS, VS, VM, O, LSE,
                           qk_scale, stride_ob, stride_oh, stride_ol, b, h, bh, n_blocks, row_start, Lq, Lk,
                           n_tiles, KV_BLOCK: gl.constexpr, t0=0, PARTS=None, part_row=0,
                           SPLIT_KV: gl.constexpr = False):  # fmt: skip
    # l and the row sums count 448 · P (LOG2_FP8_MAX off the exponent's shift): P8 needs no multiply.
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[2]
    HEAD_DIM: gl.constexpr = k_bufs.shape[3]
    ROWS: gl.constexpr = q8_smem.shape[0]
    s_layout: gl.constexpr = mma8_layout(BLOCK_N)
    o_layout: gl.constexpr = mma8_layout(HEAD_DIM)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))

    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    first = 0
    if SPLIT_KV:  # a key chunk from key tile t0
        first = t0
        cols = t0 * BLOCK_N + cols
    row_scale = qk_scale * _quantized_q(q_smem, q8_smem, q_bar)

    # Tile 0: S, its softmax, and the accumulator's first units (tile 0's V scale) with its means.
    k_scale, v_scale, v_mean = _block_scales(KS, VS, VM, bh, n_blocks, first, BLOCK_N, KV_BLOCK, o_cols)
    mbarrier.wait(k_bars.index(0), 0)
    s = warpgroup_mma(
        q8_smem,
        k_bufs.index(0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)),
        gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout),
        use_acc=False,
    )
    if Lk < (first + 1) * BLOCK_N:
        s = gl.where((cols < Lk)[None, :], s, float("-inf"))
    score_scale = row_scale * k_scale
    m_i = gl.max(s, 1) * score_scale
    p = gl.exp2(s * score_scale - (m_i - LOG2_FP8_MAX)[:, None])
    l_i = gl.sum(p, 1)
    acc = gl.convert_layout(l_i * (1.0 / v_scale), o_rows)[:, None] * v_mean[None, :]
    v_unit = v_scale
    p_smem.store(p.to(gl.float8e4nv))
    fence_async_shared()

    # The last tile, if Lk ends inside it, in a loop of its own: in the main loop ptxas applies the
    # mask to every tile (a compare and a select a score).
    if SPLIT_KV:
        n_full = gl.maximum(gl.minimum(Lk // BLOCK_N - t0, n_tiles), 1)
    else:
        n_full = gl.maximum(Lk // BLOCK_N, 1)
    for j in range(1, n_full):
        acc, m_i, l_i, v_unit = _fp8_tile(
            j, q8_smem, p_smem, acc, m_i, l_i, v_unit, k_bufs, v_bufs, k_bars, v_bars, empty_bars, KS, VS, VM,
            row_scale, bh, n_blocks, Lk, o_cols, t0, KV_BLOCK, False, SPLIT_KV,
        )  # fmt: skip
    for j in range(n_full, n_tiles):
        acc, m_i, l_i, v_unit = _fp8_tile(
            j, q8_smem, p_smem, acc, m_i, l_i, v_unit, k_bufs, v_bufs, k_bars, v_bars, empty_bars, KS, VS, VM,
            row_scale, bh, n_blocks, Lk, o_cols, t0, KV_BLOCK, True, SPLIT_KV,
        )  # fmt: skip

    last = (n_tiles - 1) % STAGES
    mbarrier.wait(v_bars.index(last), ((n_tiles - 1) // STAGES) & 1)
    acc = warpgroup_mma(p_smem, v_bufs.index(last).reshape([HEAD_DIM, BLOCK_N]).permute((1, 0)), acc)

    if SPLIT_KV:
        # The chunk's share of its rows, for forward_hopper.combine_parts: o over the chunk and its
        # base-2 logsumexp, float32, HEAD_DIM + 1 a row at PARTS from part_row.
        acc = acc * gl.convert_layout(v_unit / l_i, o_rows)[:, None]
        part_rows = (part_row + gl.arange(0, ROWS, layout=o_rows)).to(gl.int64)
        gl.store(PARTS + part_rows[:, None] * (HEAD_DIM + 1) + o_cols[None, :], acc)
        lse_rows = (part_row + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))).to(gl.int64)
        gl.store(PARTS + lse_rows * (HEAD_DIM + 1) + HEAD_DIM, m_i + gl.log2(l_i) - LOG2_FP8_MAX)
    else:
        # Written out rather than forward_hopper.store_rows: with that call ptxas (Triton 3.6, sm_90a)
        # schedules the main loop differently and the kernel takes 1.19x the time at mid, for the
        # same output (diagnostics/fp8_regression_*.txt); this form builds as it did before that call.
        acc = acc * gl.convert_layout(v_unit / l_i, o_rows)[:, None]
        s_row_idx = row_start + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
        lse = (m_i + gl.log2(l_i) - LOG2_FP8_MAX) * 0.6931471805599453
        gl.store(LSE + bh.to(gl.int64) * Lq + s_row_idx, lse, mask=s_row_idx < Lq)
        o_rows_idx = row_start + gl.arange(0, ROWS, layout=o_rows)
        o_ptrs = (
            O
            + b.to(gl.int64) * stride_ob
            + h.to(gl.int64) * stride_oh
            + o_rows_idx.to(gl.int64)[:, None] * stride_ol
            + o_cols[None, :]
        )
        gl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(o_rows_idx < Lq)[:, None])


@gluon.jit
def _fp8_program(q_desc, k_desc, vt_desc, KS, VS, VM, O, LSE, qk_scale, stride_ob, stride_oh, stride_ol, H, Lq, Lk,
                 n_blocks, bh, row_start, n_tiles, t0, PARTS, part_row, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, KV_BLOCK: gl.constexpr, Q8_LAYOUT: gl.constexpr, P8_LAYOUT: gl.constexpr,
                 SPLIT_KV: gl.constexpr):  # fmt: skip
    """One program: query block (bh, row_start) over ``n_tiles`` key tiles from ``t0`` (a key chunk's
    share to PARTS from ``part_row`` with ``SPLIT_KV``, else o and lse)."""
    ROWS: gl.constexpr = q_desc.block_type.shape[2]  # one warpgroup's rows: ROWS_PER_WARPGROUP
    NUM_CONSUMERS: gl.constexpr = 3  # the three softmax partitions below: SOFTMAX_WARPGROUPS
    b = bh // H
    h = bh % H

    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [NUM_CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
    q8_bufs = gl.allocate_shared_memory(gl.float8e4nv, [NUM_CONSUMERS, ROWS, HEAD_DIM], Q8_LAYOUT)
    p_bufs = gl.allocate_shared_memory(gl.float8e4nv, [NUM_CONSUMERS, ROWS, BLOCK_N], P8_LAYOUT)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(vt_desc.dtype, [STAGES] + vt_desc.block_type.shape, vt_desc.layout)
    q_bars, k_bars, v_bars, empty_bars = ring_barriers(NUM_CONSUMERS, STAGES)

    gl.warp_specialize(
        [
            (_fp8_softmax_partition, (q_bufs.index(0), q8_bufs.index(0), p_bufs.index(0), q_bars.index(0), k_bufs, v_bufs, k_bars, v_bars,
                                      empty_bars, KS, VS, VM, O, LSE, qk_scale, stride_ob, stride_oh, stride_ol, b, h, bh,
                                      n_blocks, row_start, Lq, Lk, n_tiles, KV_BLOCK, t0, PARTS, part_row, SPLIT_KV)),
            (_fp8_softmax_partition, (q_bufs.index(1), q8_bufs.index(1), p_bufs.index(1), q_bars.index(1), k_bufs, v_bufs, k_bars, v_bars,
                                      empty_bars, KS, VS, VM, O, LSE, qk_scale, stride_ob, stride_oh, stride_ol, b, h, bh,
                                      n_blocks, row_start + ROWS, Lq, Lk, n_tiles, KV_BLOCK, t0, PARTS, part_row + ROWS,
                                      SPLIT_KV)),
            (_fp8_softmax_partition, (q_bufs.index(2), q8_bufs.index(2), p_bufs.index(2), q_bars.index(2), k_bufs, v_bufs, k_bars, v_bars,
                                      empty_bars, KS, VS, VM, O, LSE, qk_scale, stride_ob, stride_oh, stride_ol, b, h, bh,
                                      n_blocks, row_start + 2 * ROWS, Lq, Lk, n_tiles, KV_BLOCK, t0, PARTS,
                                      part_row + 2 * ROWS, SPLIT_KV)),
            (_fp8_load_partition, (q_desc, k_desc, vt_desc, q_bufs, k_bufs, v_bufs, q_bars, k_bars, v_bars, empty_bars,
                                   b, h, bh, row_start, n_tiles, BLOCK_N, STAGES, t0, SPLIT_KV)),
        ],
        [4, 4, 1],
        [160, 160, 24],
    )  # fmt: skip


@gluon.jit
def _fp8_attn_fwd_hopper_kernel(
    q_desc, k_desc, vt_desc, KS, VS, VM, O, LSE, qk_scale,
    stride_ob, stride_oh, stride_ol,
    H, Lq, Lk, n_blocks,
    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, KV_BLOCK: gl.constexpr, Q8_LAYOUT: gl.constexpr, P8_LAYOUT: gl.constexpr,
):  # fmt: skip
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2] * 3  # SOFTMAX_WARPGROUPS of ROWS_PER_WARPGROUP
    n_m = gl.cdiv(Lq, BLOCK_M)
    pid = gl.program_id(0)
    _fp8_program(q_desc, k_desc, vt_desc, KS, VS, VM, O, LSE, qk_scale, stride_ob, stride_oh, stride_ol, H, Lq, Lk,
                 n_blocks, pid // n_m, (pid % n_m) * BLOCK_M, gl.cdiv(Lk, BLOCK_N), 0, None, 0, HEAD_DIM, BLOCK_N,
                 STAGES, KV_BLOCK, Q8_LAYOUT, P8_LAYOUT, False)  # fmt: skip


@gluon.jit
def _fp8_attn_fwd_split_kernel(
    q_desc, k_desc, vt_desc, KS, VS, VM, PARTS, qk_scale,
    H, Lq, Lk, n_blocks, first_block, split,
    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, KV_BLOCK: gl.constexpr, Q8_LAYOUT: gl.constexpr, P8_LAYOUT: gl.constexpr,
):  # fmt: skip
    """Long rows in key chunks (``forward``): chunk-major, program t takes query block
    first_block + t % blocks over key chunk t // blocks (``blocks``: the launch's query blocks) and
    stores its rows' shares at PARTS from row (block index · split + chunk) · BLOCK_M. The programs
    that run at once then read one chunk's keys, as one-chunk programs read the same keys."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2] * 3  # SOFTMAX_WARPGROUPS of ROWS_PER_WARPGROUP
    n_m = gl.cdiv(Lq, BLOCK_M)
    t = gl.program_id(0)
    blocks = gl.num_programs(0) // split
    local = t % blocks
    block = first_block + local
    chunk = t // blocks
    all_tiles = gl.cdiv(Lk, BLOCK_N)
    t0 = chunk * all_tiles // split
    _fp8_program(q_desc, k_desc, vt_desc, KS, VS, VM, None, None, qk_scale, 0, 0, 0, H, Lq, Lk, n_blocks,
                 block // n_m, (block % n_m) * BLOCK_M, (chunk + 1) * all_tiles // split - t0, t0, PARTS,
                 (local * split + chunk) * BLOCK_M, HEAD_DIM, BLOCK_N, STAGES, KV_BLOCK, Q8_LAYOUT, P8_LAYOUT,
                 True)  # fmt: skip


# Per head dim: (BLOCK_N, STAGES). BLOCK_N divides KV_BLOCK, so a tile has one K and one V scale.
CONFIGS = {64: (128, 4), 128: (64, 4)}


def config_string(head_dim: int, lk: int = 1) -> str:
    """The config a call at ``head_dim`` over ``lk`` keys runs, as the benchmark rows record it."""
    block_n, stages = CONFIGS[head_dim]
    chunks = key_chunks(lk, block_n)
    return (
        f"gluon-fp8:BLOCK_M={BLOCK_M},BLOCK_N={block_n},stages={stages},warpgroups={SOFTMAX_WARPGROUPS}+load"
        + (f",key_chunks={chunks}" if chunks > 1 else "")
    )


# The most key tiles one accumulator sums before the rows split into key chunks. Hopper's e4m3
# wgmma adds each tile's P V into the fp32 accumulator in reduced precision, so O's error grows with
# the tiles a row sums: measured on the H100 against float32 (05 README, diagnostics/fp8_long_rows),
# 5.4-5.7% up to 781 tiles, 6.6% at 1 563 (200 000 keys at D = 64), 9.2% at 3 125 (200 000 at
# D = 128), against ERROR_BOUND's 8%. At large, chunks take D = 128 from 137-141 ms to 131-135 (two)
# but D = 64 from 148-154 to 162 (diagnostics/fp8_key_chunks), so the limit keeps D = 64's 200 000
# keys in one chunk.
MAX_SUM_TILES = 1600


def key_chunks(lk: int, block_n: int) -> int:
    """The key chunks a row of ``lk`` keys in tiles of ``block_n`` runs in: each sums at most
    MAX_SUM_TILES tiles."""
    return cdiv(cdiv(lk, block_n), MAX_SUM_TILES)


# Compiled once per signature of q, o and the quantised K/V (and the scale), then launched directly.
_LAUNCHES = LaunchCache(first_launch)
_SPLIT_LAUNCHES = LaunchCache(first_launch)


def forward(
    q, k8, k_scales, v8t, v_scales, v_means, o, lse, qk_scale: float, kv_block: int, lk: int, config=None,
    split: int | None = None,
) -> None:  # fmt: skip
    """Write o and lse for a checked q (``forward_hopper.unsupported_reason(q)`` None) and
    ``fp8._quantize_kv``'s K8 (B·H, Lk', D), K scales (B·H, Lk'/kv_block), V8ᵀ (B·H, D, Lk'), V
    scales and V means (B·H, Lk'/kv_block, D) of ``lk`` keys into o (B, H, Lq, D) and lse (B, H, Lq)
    float32. ``qk_scale`` is the softmax scale times log2(e); ``config`` (BLOCK_N, STAGES) overrides
    ``CONFIGS[D]``. Rows longer than MAX_SUM_TILES key tiles (``key_chunks``; ``split`` overrides it)
    run as ``split`` programs a query block over chunks of the keys, merged by
    ``forward_hopper.combine_parts``: in a kernel of their own, so that the one-chunk launch keeps the
    build phase 05 times."""
    B, H, Lq, D = q.shape
    block_n, stages = config or CONFIGS[D]
    programs = cdiv(Lq, BLOCK_M) * B * H
    n_key_tiles = cdiv(lk, block_n)
    split = key_chunks(lk, block_n) if split is None else split
    if not 1 <= split <= n_key_tiles:
        raise ValueError(
            f"split: expected 1..{n_key_tiles} key chunks (one per key tile at most), got {split}"
        )
    descriptors = (
        descriptor(q, ROWS_PER_WARPGROUP),
        block_descriptor(k8, (1, block_n, D)),
        block_descriptor(v8t, (1, D, block_n)),
    )
    constexprs = {
        "HEAD_DIM": D, "BLOCK_N": block_n, "STAGES": stages, "KV_BLOCK": kv_block,
        "Q8_LAYOUT": shared_layout((ROWS_PER_WARPGROUP, D), k8.dtype),
        "P8_LAYOUT": shared_layout((ROWS_PER_WARPGROUP, block_n), k8.dtype), "num_warps": 4,
    }  # fmt: skip
    if split == 1:
        launch(
            _LAUNCHES,
            _fp8_attn_fwd_hopper_kernel,
            (programs,),
            (*descriptors, k_scales, v_scales, v_means, o, lse),
            (float(qk_scale), o.stride(0), o.stride(1), o.stride(2), H, Lq, lk, k_scales.shape[1]),
            constexprs,
            key_tensors=(q, o),
        )
        return
    parts = torch.empty((programs * split * BLOCK_M, D + 1), dtype=torch.float32, device=q.device)
    launch(
        _SPLIT_LAUNCHES,
        _fp8_attn_fwd_split_kernel,
        (programs * split,),
        (*descriptors, k_scales, v_scales, v_means, parts),
        (float(qk_scale), H, Lq, lk, k_scales.shape[1], 0, split),
        constexprs,
        key_tensors=(q, parts),
    )
    combine_parts(parts, o, lse, 0, split)


__all__ = ["CONFIGS", "MAX_SUM_TILES", "config_string", "forward", "key_chunks"]
