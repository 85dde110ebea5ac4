"""The attention forward on Hopper in Gluon: warp-specialised, one warpgroup's softmax under another's products.

    o = softmax(scale · q kᵀ) v,   lse = logsumexp(scale · q kᵀ)   (natural log, per query row)

The same online softmax as ``forward.py`` (running max ``m`` and sum ``l`` in the base-2 domain,
scale·log2(e) folded into one multiply), written in Gluon (``triton.experimental.gluon``), where the
kernel states what Triton's compiler otherwise decides: which warps do what, the shared-memory ring
K and V arrive in, the layouts, and when each warpgroup MMA is awaited.

Why: at D = 64 a tile's two products take as many SM cycles on the tensor cores as its
exponentials take on the exponential unit; the Triton loop issues them in turn, and all its warps
stop together at every barrier the loads need. Here a program owns 3 x 64 = 192 query rows:

- one **load warp** copies Q once and then K and V tiles into a STAGES-deep ring (TMA, one
  mbarrier per buffer for "full"; it waits on an "empty" mbarrier before reusing a slot);
- each **softmax warpgroup** (4 warps, 64 rows) is written as FlashAttention-3's intra-warpgroup
  overlap: iteration j issues S_j = Q K_jᵀ and O += P_{j-1} V_{j-1} asynchronously and waits for
  S_j alone before P_j's softmax; P stays in registers as the MMA's A operand. In the sm_90a build
  (ptxas of Triton 3.6) the wait for the P V product is hoisted above the exponentials, so within
  a warpgroup the products and the softmax alternate; the overlap is between warpgroups. A
  warpgroup releases a slot (arrives on "empty") once its P V product is done; the warpgroups
  never wait for each other, so one's softmax overlaps another's products.

Addressing: host-side 4-D tensor descriptors over (B, H, L, D) with the caller's strides, so the
model's strided q, k, v are read in place and every row past Lq or Lk of its head reads as zeros;
the score columns past Lk are masked to -inf on the last tile only. o is written with plain stores
(masked rows), lse per row.

One program runs on each SM. Where the query blocks beyond the last whole wave fill at most half
the SMs (``tail_split``), they run at the end of the grid as programs over chunks of the keys
(``SPLIT_KV``), each writing its rows' o over the chunk and logsumexp in float32, merged by
``combine_parts``: the last wave then takes a fraction of a block's time.

Causal (``CAUSAL``, key j kept for query i when i >= j, top-left aligned; flash2 takes it): a
program stops at its last row's diagonal, each warpgroup masks only the tiles that reach past its
first row, and the grid runs the longest programs first (the last query block of every head, then
the one before). The three warpgroups share one K/V ring, so the two upper ones also run the one or
two fully masked tiles the lowest needs (P = 0 there).

Hopper only (sm_90), 16-bit inputs, D in 64 or 128, TMA-addressable strides (``unsupported_reason``).
Gluon kernels do not run in Triton's interpreter: ``forward.py``'s Triton kernel is the path
everywhere else, and this one is tested on the GPU and built for sm_90a on the CPU.
"""

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .._gluon import block_descriptor, mma_layout
from .._launch import LaunchCache, first_launch, launch, tma_ok
from .._runtime import INTERPRET, capability, cdiv, sm_count
from ._common import tail_split

GLUON_HEAD_DIMS = (64, 128)
ROWS_PER_WARPGROUP = 64
SOFTMAX_WARPGROUPS = 3
BLOCK_M = ROWS_PER_WARPGROUP * SOFTMAX_WARPGROUPS


@gluon.jit
def load_q_tiles(q_desc, q_bufs, q_bars, b, h, row_start):
    """The load warp's first copies: each consumer's Q tile of one head from ``row_start`` on."""
    ROWS: gl.constexpr = q_desc.block_type.shape[2]
    NUM_CONSUMERS: gl.constexpr = q_bufs.shape[0]
    for c in gl.static_range(NUM_CONSUMERS):
        mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            q_desc, [b, h, row_start + c * ROWS, 0], q_bars.index(c), q_bufs.index(c)
        )


@gluon.jit
def _load_partition(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bars, k_bars, v_bars, empty_bars, b, h,
                    row_start, n_tiles, t0, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    load_q_tiles(q_desc, q_bufs, q_bars, b, h, row_start)
    for j in range(n_tiles):
        slot = j % STAGES
        # The slot's previous tile must be released by every consumer first.
        mbarrier.wait(empty_bars.index(slot), ((j // STAGES) + 1) & 1, pred=j >= STAGES)
        mbarrier.expect(k_bars.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            k_desc, [b, h, (t0 + j) * BLOCK_N, 0], k_bars.index(slot), k_bufs.index(slot)
        )
        mbarrier.expect(v_bars.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            v_desc, [b, h, (t0 + j) * BLOCK_N, 0], v_bars.index(slot), v_bufs.index(slot)
        )


@gluon.jit
def _masked(s, keys, rows, Lk, CAUSAL: gl.constexpr):
    """Scores of keys past Lk, and causal of keys past the query (top-left aligned), to -inf."""
    keep = (keys < Lk)[None, :]
    if CAUSAL:
        keep = keep & (keys[None, :] <= rows[:, None])
    return gl.where(keep, s, float("-inf"))


@gluon.jit
def _softmax_tile(j, q, p, acc, m_i, l_i, k_bufs, v_bufs, k_bars, v_bars, empty_bars, qk_scale, s_row_idx, Lk,
                  CAUSAL: gl.constexpr, masked, t0=0):  # fmt: skip
    """Ring tile ``j``: issues S_j = Q K_jᵀ and O += P_{j-1} V_{j-1}, waits for S_j, folds it into
    the online softmax (``masked``, a constant or a runtime flag: keys past Lk, and causal, to -inf
    first), then waits for the P V product, releases its slot and rescales O. Returns (P_j as the
    next A operand, O, m, l)."""
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    HEAD_DIM: gl.constexpr = k_bufs.shape[4]
    ROWS: gl.constexpr = q.shape[0]
    dtype: gl.constexpr = k_bufs.dtype
    s_layout: gl.constexpr = mma_layout(BLOCK_N)
    o_layout: gl.constexpr = mma_layout(HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    slot = j % STAGES
    prev = (j - 1) % STAGES
    mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
    s_tok = warpgroup_mma(
        q,
        k_bufs.index(slot).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)),
        gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout),
        use_acc=False,
        is_async=True,
    )
    mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
    o_tok = warpgroup_mma(p, v_bufs.index(prev).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
    s = warpgroup_mma_wait(1, deps=[s_tok])
    if masked:
        s = _masked(
            s,
            (t0 + j) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout)),
            s_row_idx,
            Lk,
            CAUSAL,
        )
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    p_new = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p_new, 1)
    acc, p = warpgroup_mma_wait(0, deps=[o_tok, p])
    mbarrier.arrive(empty_bars.index(prev), count=1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    return gl.convert_layout(p_new.to(dtype), p_layout), acc, m_new, l_i


@gluon.jit
def _softmax_partition(q_smem, q_bar, k_bufs, v_bufs, k_bars, v_bars, empty_bars, O, LSE, qk_scale,
                       stride_ob, stride_oh, stride_ol, b, h, pid_bh, row_start, Lq, Lk, n_tiles, t0, PARTS,
                       part_row, is_tail, CAUSAL: gl.constexpr, SPLIT_KV: gl.constexpr):  # fmt: skip
    # One warpgroup's 64 query rows from row_start; the tile sizes come with the buffers' types.
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    HEAD_DIM: gl.constexpr = k_bufs.shape[4]
    ROWS: gl.constexpr = q_smem.shape[2]
    dtype: gl.constexpr = k_bufs.dtype
    s_layout: gl.constexpr = mma_layout(BLOCK_N)
    o_layout: gl.constexpr = mma_layout(HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    q = q_smem.reshape([ROWS, HEAD_DIM])
    cols = t0 * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    s_row_idx = row_start + gl.arange(0, ROWS, layout=s_rows)
    # Tiles reaching past this key are masked: past Lk, and causal, past this warpgroup's first row.
    mask_from = gl.minimum(Lk, row_start + 1) if CAUSAL else Lk
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bars.index(0), 0)
    s = warpgroup_mma(
        q,
        k_bufs.index(0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)),
        gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout),
        use_acc=False,
    )
    if mask_from < (t0 + 1) * BLOCK_N:
        s = _masked(s, cols, s_row_idx, Lk, CAUSAL)
    m_i = gl.max(s, 1) * qk_scale
    p = gl.exp2(s * qk_scale - m_i[:, None])
    l_i = gl.sum(p, 1)
    p = gl.convert_layout(p.to(dtype), p_layout)

    if CAUSAL:  # the mask's condition checked a tile (two loops spill 692 bytes a thread at D = 64)
        for j in range(1, n_tiles):
            p, acc, m_i, l_i = _softmax_tile(j, q, p, acc, m_i, l_i, k_bufs, v_bufs, k_bars, v_bars, empty_bars,
                                             qk_scale, s_row_idx, Lk, CAUSAL, (j + 1) * BLOCK_N > mask_from)  # fmt: skip
    else:
        # The last tile, if Lk ends inside it, in a loop of its own: in the main loop ptxas applied
        # the mask to every tile (a compare and a select a score, 96 of 550 instructions at D = 64).
        n_full = gl.maximum(gl.minimum(Lk // BLOCK_N - t0, n_tiles), 1)
        for j in range(1, n_full):
            p, acc, m_i, l_i = _softmax_tile(j, q, p, acc, m_i, l_i, k_bufs, v_bufs, k_bars, v_bars, empty_bars,
                                             qk_scale, s_row_idx, Lk, CAUSAL, False, t0)  # fmt: skip
        for j in range(n_full, n_tiles):
            p, acc, m_i, l_i = _softmax_tile(j, q, p, acc, m_i, l_i, k_bufs, v_bufs, k_bars, v_bars, empty_bars,
                                             qk_scale, s_row_idx, Lk, CAUSAL, True, t0)  # fmt: skip

    last = (n_tiles - 1) % STAGES
    mbarrier.wait(v_bars.index(last), ((n_tiles - 1) // STAGES) & 1)
    acc = warpgroup_mma(p, v_bufs.index(last).reshape([BLOCK_N, HEAD_DIM]), acc)

    o = acc / gl.convert_layout(l_i, o_rows)[:, None]
    lse2 = m_i + gl.log2(l_i)
    if SPLIT_KV:  # (is_tail is a plain False without it, which Gluon does not take as a condition)
        if is_tail:
            # A key chunk's share of its rows (``forward``'s tail): o normalised over the chunk and
            # its base-2 logsumexp, in float32 at PARTS' rows from part_row, for _combine_parts_kernel.
            o_rows_idx = part_row + gl.arange(0, ROWS, layout=o_rows)
            o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
            gl.store(PARTS + o_rows_idx.to(gl.int64)[:, None] * (HEAD_DIM + 1) + o_cols[None, :], o)
            lse_rows = part_row + gl.arange(0, ROWS, layout=s_rows)
            gl.store(PARTS + lse_rows.to(gl.int64) * (HEAD_DIM + 1) + HEAD_DIM, lse2)
        else:
            store_rows(o, lse2, O, LSE, stride_ob, stride_oh, stride_ol, b, h, pid_bh, row_start, Lq)
    else:
        store_rows(o, lse2, O, LSE, stride_ob, stride_oh, stride_ol, b, h, pid_bh, row_start, Lq)


@gluon.jit
def store_rows(o, lse2, O, LSE, stride_ob, stride_oh, stride_ol, b, h, bh, row_start, Lq):
    """A warpgroup's rows from ``row_start``: ``o`` (fp32, the accumulator's layout) into O in its
    dtype and ``lse2`` (base 2, the rows' slice of an MMA layout) into LSE in natural log; rows past
    Lq are not written."""
    ROWS: gl.constexpr = o.shape[0]
    rows = row_start + gl.arange(0, ROWS, layout=lse2.type.layout)
    gl.store(LSE + bh.to(gl.int64) * Lq + rows, lse2 * 0.6931471805599453, mask=rows < Lq)
    o_rows = row_start + gl.arange(0, ROWS, layout=gl.SliceLayout(1, o.type.layout))
    o_cols = gl.arange(0, o.shape[1], layout=gl.SliceLayout(0, o.type.layout))
    o_ptrs = (
        O
        + b.to(gl.int64) * stride_ob
        + h.to(gl.int64) * stride_oh
        + o_rows.to(gl.int64)[:, None] * stride_ol
        + o_cols[None, :]
    )
    gl.store(o_ptrs, o.to(O.dtype.element_ty), mask=(o_rows < Lq)[:, None])


@gluon.jit
def ring_barriers(NUM_CONSUMERS: gl.constexpr, STAGES: gl.constexpr):
    """The forward's mbarriers, initialised: one per consumer for its Q tile, and per ring slot
    "K full", "V full" (one arrival: the load warp's) and "empty" (one arrival a consumer)."""
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
    return q_bars, k_bars, v_bars, empty_bars


@gluon.jit
def _attn_fwd_hopper_kernel(
    q_desc, k_desc, v_desc, O, LSE, PARTS, qk_scale,
    stride_ob, stride_oh, stride_ol,
    H, Lq, Lk, first_block, split,
    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr = False,
    SPLIT_KV: gl.constexpr = False,
):  # fmt: skip
    ROWS: gl.constexpr = q_desc.block_type.shape[2]  # one warpgroup's rows: ROWS_PER_WARPGROUP
    NUM_CONSUMERS: gl.constexpr = 3  # the three softmax partitions below: SOFTMAX_WARPGROUPS
    BLOCK_M: gl.constexpr = ROWS * NUM_CONSUMERS
    dtype: gl.constexpr = q_desc.dtype
    n_m = gl.cdiv(Lq, BLOCK_M)
    pid = gl.program_id(0)
    t0 = 0
    part_row = 0
    is_tail = False
    if SPLIT_KV:
        # Programs from ``first_block`` on are the tail's key chunks: query block first_block +
        # t // split over key chunk t % split (t = pid - first_block); their rows' shares go to
        # PARTS from row t * BLOCK_M.
        is_tail = pid >= first_block
        t = gl.maximum(pid - first_block, 0)
        part_row = t * BLOCK_M
        chunk = t % split
        pid = gl.where(is_tail, first_block + t // split, pid)
        all_tiles = gl.cdiv(Lk, BLOCK_N)
        t0 = gl.where(is_tail, chunk * all_tiles // split, 0)
    if CAUSAL:
        # Heaviest first: the last query block of every head, then the one before; a block stops at
        # its last row's diagonal.
        n_bh = gl.num_programs(0) // n_m
        pid_bh = pid % n_bh
        row_start = (n_m - 1 - pid // n_bh) * BLOCK_M
        n_tiles = gl.cdiv(gl.minimum(Lk, row_start + BLOCK_M), BLOCK_N)
    else:
        pid_bh = pid // n_m
        row_start = (pid % n_m) * BLOCK_M
        n_tiles = gl.cdiv(Lk, BLOCK_N)
        if SPLIT_KV:
            n_tiles = gl.where(is_tail, (chunk + 1) * n_tiles // split - t0, n_tiles)
    b = pid_bh // H
    h = pid_bh % H

    q_bufs = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bars, k_bars, v_bars, empty_bars = ring_barriers(NUM_CONSUMERS, STAGES)

    # Three softmax warpgroups (the default partition and two workers: the same function on
    # different rows) and one load warp. The workers' register requests are the ones built without
    # spills for sm_90a (128 or 192 for the softmax workers spill ~650 bytes a thread).
    gl.warp_specialize(
        [
            (_softmax_partition, (q_bufs.index(0), q_bars.index(0), k_bufs, v_bufs, k_bars, v_bars, empty_bars, O, LSE,
                                  qk_scale, stride_ob, stride_oh, stride_ol, b, h, pid_bh, row_start, Lq, Lk, n_tiles,
                                  t0, PARTS, part_row, is_tail, CAUSAL, SPLIT_KV)),
            (_softmax_partition, (q_bufs.index(1), q_bars.index(1), k_bufs, v_bufs, k_bars, v_bars, empty_bars, O, LSE,
                                  qk_scale, stride_ob, stride_oh, stride_ol, b, h, pid_bh, row_start + ROWS, Lq, Lk,
                                  n_tiles, t0, PARTS, part_row + ROWS, is_tail, CAUSAL, SPLIT_KV)),
            (_softmax_partition, (q_bufs.index(2), q_bars.index(2), k_bufs, v_bufs, k_bars, v_bars, empty_bars, O, LSE,
                                  qk_scale, stride_ob, stride_oh, stride_ol, b, h, pid_bh, row_start + 2 * ROWS, Lq, Lk,
                                  n_tiles, t0, PARTS, part_row + 2 * ROWS, is_tail, CAUSAL, SPLIT_KV)),
            (_load_partition, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bars, k_bars, v_bars, empty_bars, b, h,
                               row_start, n_tiles, t0, BLOCK_N, STAGES)),
        ],
        [4, 4, 1],
        [160, 160, 24],
    )  # fmt: skip


@triton.jit
def _combine_parts_kernel(PARTS, O, LSE, first_block, split, n_m, H, Lq, stride_ob, stride_oh, stride_ol,
                          BLOCK_M: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):  # fmt: skip
    """Rows ``program_id(1)`` (ROWS of them) of tail query block ``program_id(0)``: its ``split`` key
    chunks' shares in PARTS (o normalised over the chunk, then its base-2 logsumexp, HEAD_DIM + 1
    floats a row) merged, o_i weighted by exp2(lse_i - lse), into O and LSE (natural log)."""
    t = tl.program_id(0)
    rb = tl.program_id(1)
    block = first_block + t
    pid_bh = block // n_m
    r = tl.arange(0, ROWS)
    cols = tl.arange(0, HEAD_DIM)
    m = tl.full([ROWS], float("-inf"), tl.float32)
    for i in range(split):
        part = ((t * split + i) * BLOCK_M + rb * ROWS + r).to(tl.int64) * (HEAD_DIM + 1)
        m = tl.maximum(m, tl.load(PARTS + part + HEAD_DIM))
    acc = tl.zeros([ROWS, HEAD_DIM], tl.float32)
    total = tl.zeros([ROWS], tl.float32)
    for i in range(split):
        part = ((t * split + i) * BLOCK_M + rb * ROWS + r).to(tl.int64) * (HEAD_DIM + 1)
        w = tl.exp2(tl.load(PARTS + part + HEAD_DIM) - m)
        acc += w[:, None] * tl.load(PARTS + part[:, None] + cols[None, :])
        total += w
    rows = (block % n_m) * BLOCK_M + rb * ROWS + r
    keep = rows < Lq
    tl.store(LSE + pid_bh.to(tl.int64) * Lq + rows, (m + tl.log2(total)) * 0.6931471805599453, mask=keep)
    b = pid_bh // H
    h = pid_bh % H
    o_ptrs = (
        O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + rows.to(tl.int64)[:, None] * stride_ol
    )
    o = acc / total[:, None]
    tl.store(o_ptrs + cols[None, :], o.to(O.dtype.element_ty), mask=keep[:, None])


def combine_parts(parts, o, lse, first_block: int, split: int) -> None:
    """The tail's key-chunk shares ``parts`` (tail blocks · split · BLOCK_M rows, D + 1 floats) merged
    into their rows of o (B, H, Lq, D, unit stride along D) and lse (B, H, Lq); tail block t is query
    block ``first_block + t`` of the grid (BLOCK_M-row blocks, head by head)."""
    B, H, Lq, D = o.shape
    n_tail = parts.shape[0] // (split * BLOCK_M)
    launch(
        _COMBINE_LAUNCHES,
        _combine_parts_kernel,
        (n_tail, SOFTMAX_WARPGROUPS),
        (parts, o, lse),
        (first_block, split, cdiv(Lq, BLOCK_M), H, Lq, o.stride(0), o.stride(1), o.stride(2)),
        {"BLOCK_M": BLOCK_M, "ROWS": ROWS_PER_WARPGROUP, "HEAD_DIM": D, "num_warps": 4},
    )


# Per head dim: (BLOCK_N, STAGES), measured on the H100 (reports/data/02_attn_fwd/diagnostics/).
# D = 64: 128-key tiles, 3 stages (2 stages within 1-2%, 64-key tiles 0.96-1.08x cuDNN). D = 128:
# 64-key tiles, where a softmax warpgroup's S, O and P fit without spilling (128-key tiles spill
# 850 bytes a thread); 3 stages 1.02x cuDNN at mid against 0.87x with 2.
CONFIGS = {64: (128, 3), 128: (64, 3)}


def descriptor(t: torch.Tensor, block_rows: int) -> TensorDescriptor:
    """A (B, H, L, D) tensor's TMA descriptor, tiles of ``block_rows`` rows of one head."""
    return block_descriptor(t, (1, 1, block_rows, t.shape[-1]))


def unsupported_reason(q: torch.Tensor, *tensors: torch.Tensor) -> str | None:
    """Why a Gluon forward cannot take the call, or None: it needs a Hopper GPU (sm_90), bf16/fp16,
    D in 64 or 128, and strides a tensor descriptor can address in q and ``tensors`` (this kernel's
    k and v; ``fp8_hopper`` reads q alone so). Never in Triton's interpreter."""
    if INTERPRET:
        return "a GPU (Gluon kernels do not run in Triton's interpreter)"
    if not q.is_cuda or capability(q.device)[0] != 9:
        return "a Hopper GPU (compute capability 9.x)"
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"bf16 or fp16 inputs, got {q.dtype}"
    if q.shape[-1] not in GLUON_HEAD_DIMS:
        return f"head dim in {GLUON_HEAD_DIMS}, got {q.shape[-1]}"
    if not tma_ok(q, *tensors):
        return "unit stride along D and 16-byte aligned rows and starts (TMA)"
    return None


def config_string(head_dim: int) -> str:
    """The config a call at ``head_dim`` runs, as the benchmark rows record it."""
    block_n, stages = CONFIGS[head_dim]
    return f"gluon:BLOCK_M={BLOCK_M},BLOCK_N={block_n},stages={stages},warpgroups={SOFTMAX_WARPGROUPS}+load"


# Compiled once per signature of q, k, v (and o's strides, scale, config), then launched directly.
_LAUNCHES = LaunchCache(first_launch)
_COMBINE_LAUNCHES = LaunchCache(first_launch)


def forward(
    q, k, v, o, lse, qk_scale: float, causal: bool = False, tail: tuple[int, int] | None = None
) -> None:
    """Write o and lse for checked q, k, v (``unsupported_reason`` None) into the allocated o
    (B, H, Lq, D) and lse (B, H, Lq) float32. ``qk_scale`` is the softmax scale times log2(e);
    ``causal`` keeps key j for query i when i >= j (top-left aligned). Not causal, the last wave's
    query blocks (``tail_split``; ``tail`` (blocks, split) overrides it) run at the end of the grid
    as ``split`` programs over chunks of the keys each, filling the SMs the others free, and
    ``combine_parts`` merges their shares."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    block_n, stages = CONFIGS[D]
    programs = cdiv(Lq, BLOCK_M) * B * H
    if tail is not None and causal:
        raise ValueError("tail: only a non-causal forward splits its last query blocks")
    n_tail, split = (0, 1) if causal else tail or tail_split(programs, sm_count(q.device), cdiv(Lk, block_n))
    if not (0 <= n_tail <= programs and 1 <= split <= max(cdiv(Lk, block_n), 1)):
        raise ValueError(f"tail: expected (blocks in 0..{programs}, split in 1..key tiles), got {tail}")
    whole = programs - n_tail
    parts = None
    if n_tail:
        parts = torch.empty((n_tail * split * BLOCK_M, D + 1), dtype=torch.float32, device=q.device)
    launch(
        _LAUNCHES,
        _attn_fwd_hopper_kernel,
        (whole + n_tail * split,),
        (descriptor(q, ROWS_PER_WARPGROUP), descriptor(k, block_n), descriptor(v, block_n), o, lse, parts),
        (float(qk_scale), o.stride(0), o.stride(1), o.stride(2), H, Lq, Lk, whole, split),
        {"HEAD_DIM": D, "BLOCK_N": block_n, "STAGES": stages, "CAUSAL": causal, "SPLIT_KV": n_tail > 0,
         "num_warps": 4},
        key_tensors=(q, k, v, o, parts),
    )  # fmt: skip
    if n_tail:
        combine_parts(parts, o, lse, whole, split)


__all__ = ["GLUON_HEAD_DIMS", "combine_parts", "config_string", "forward", "unsupported_reason"]
