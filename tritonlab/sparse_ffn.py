"""A fixed-slice backward for linear layers: dX from the first N rows of dY only.

**This backward is numerically WRONG for training.** It truncates the gradient by *position* (the
first N rows of the flattened (tokens, features) gradient), not by importance: every token past row
N gets dX = 0, whatever its gradient was. It exists to measure what such a restricted kernel could
buy if that sparsity were ever justified -- never use it to train a model you care about.

For a linear layer y = x Wᵀ + b with x (T, D_IN) flattened over (batch, sequence) -- row
t = b·S + s, so the first N rows are the first N/S sequences of the batch -- W (D_OUT, D_IN):

    exact:        dX = dY W,                    dW = dYᵀ x,   db = Σ_t dY
    fixed slice:  dX[:N] = dY[:N] W,  dX[N:] = 0,  dW = dYᵀ x (full dY),  db = Σ_t dY

- ``fixed_slice_matmul(dy, w, n_rows)``: the Triton kernel, dy (T, K), w (K, D) -> dx (T, D) with
  dx[:n_rows] = dy[:n_rows] @ w and dx[n_rows:] = 0. One launch covers all T rows: a program whose
  row block lies past n_rows skips its K loop and stores a zero tile; the block that straddles n_rows
  loads masked (zero) rows and so stores exact zeros there. This is faster than a wrapper's
  ``torch.zeros`` followed by the slice GEMM: dX is written once (T·D values) instead of T·D + N·D,
  in one launch instead of two, and the zero tiles cost nothing but their stores. Autotuned over a
  small config space pruned by shared memory (``tritonlab.tuning``); bf16, fp16 and fp32 with fp32
  accumulation (fp32 dots IEEE unless ``torch.set_float32_matmul_precision`` allows TF32).
  On Hopper, 16-bit operands that a TMA descriptor can address take a second kernel: persistent (one
  program per SM walks the output tiles; with ``flatten`` the next tile's loads overlap this tile's
  store), dy, w and dx read and written through host tensor descriptors. dy's descriptor spans the
  first n_rows rows only, so the straddling block reads zeros past the slice without masks; the
  tiles past it are stored as zeros in a second loop. Its tuning also covers one program per tile.
  A short slice leaves most SMs idle in that kernel; there a third kernel, the short-slice kernel,
  runs one program a tile over rings of 4 to 8 stages (what a lone program streaming its K range
  needs), and the zero tiles past the slice as programs of the same launch, on the SMs the slice
  leaves idle.
  Over a long K, where the slice's 192 x 128 tiles make 0.75 to 2 waves (bert-base's 4 096 x 768
  intermediate dX at N = all: 132 tiles on 132 SMs, against 1.45 waves of 128 x 128), a fourth kernel
  runs, in Gluon: a TMA load warp and three wgmma warpgroups of 64 rows over a 5-deep ring, each
  warpgroup's tile stored by TMA from its own spent ring slots; the load warp also stores the
  program's share of the zero rows past the slice, a box with each K step (phase sparse_ffn's README
  has the measured rules and ratios).
- ``SlicedBackwardLinear``: an ``nn.Linear`` (sharing the original layer's parameters) whose forward
  is exactly ``F.linear`` and whose backward computes dX with ``fixed_slice_matmul``.
  **dW is computed from the full dY**, as usual: the study is about what restricting dX buys, so
  only dX changes and the measured difference is the kernel's alone; a dW from the slice would also
  cut the weight gradient (at n_rows = 0 to nothing) and mix two effects in one number. In a BERT FFN
  the upstream dY of ``intermediate.dense`` is already zero past row N (it is the GELU of the sliced
  dX of ``output.dense``), so there the two choices give the same dW anyway.
- ``replace_ffn(model, n_rows, layers=None)``: swaps the FFN layers (``intermediate.dense`` and
  ``output.dense``) of Hugging Face BERT or RoBERTa encoder layers for ``SlicedBackwardLinear``, in
  place. ``transformers`` is imported there only: the rest of this module does not need it.
"""

from collections.abc import Iterable

import torch
import triton
import triton.language as tl
from torch import Tensor, nn
from torch.nn import functional as F
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.tools.tensor_descriptor import TensorDescriptor

from . import tuning, tuning_tables
from ._gemm import compute_dtype, shared_memory_pruner
from ._gluon import block_descriptor, mma_layout
from ._launch import LaunchCache, autotune_for_launch, first_launch, signature_key, tma_ok
from ._runtime import INTERPRET, capability, cdiv, sm_count
from .checks import check_choice, check_offset_range, check_same, check_tensor
from .tuning import ConfigRecord, describe_config, dot_precision

__all__ = ["SlicedBackwardLinear", "fixed_slice_matmul", "replace_ffn", "sliced_backward_linear"]


@triton.jit
def _fixed_slice_matmul_kernel(
    dy_ptr,
    w_ptr,
    dx_ptr,
    T,
    N_ROWS,
    K,
    D,
    stride_dyt,
    stride_dyk,
    stride_wk,
    stride_wd,
    stride_dxt,
    stride_dxd,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """dx[rows, cols] = dy[rows] @ w[:, cols] for rows < N_ROWS, 0 for the others; 1-D grid of
    (row blocks of T) × (column blocks of D), row blocks grouped by GROUP_M for L2 reuse of w."""
    pid = tl.program_id(0)
    n_m = tl.cdiv(T, BLOCK_M)
    n_n = tl.cdiv(D, BLOCK_N)
    per_group = GROUP_M * n_n
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(n_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_size
    pid_n = (pid % per_group) // group_size

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    in_slice = offs_m < N_ROWS
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # A row block wholly past the slice runs no K loop: it only stores its zero tile.
    k_end = tl.where(pid_m * BLOCK_M < N_ROWS, K, 0)
    for k0 in range(0, k_end, BLOCK_K):
        k = k0 + offs_k
        a = tl.load(
            dy_ptr + offs_m[:, None] * stride_dyt + k[None, :] * stride_dyk,
            mask=in_slice[:, None] & (k < K)[None, :],
            other=0.0,
        )
        b = tl.load(
            w_ptr + k[:, None] * stride_wk + offs_n[None, :] * stride_wd,
            mask=(k < K)[:, None] & (offs_n < D)[None, :],
            other=0.0,
        )
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    tl.store(
        dx_ptr + offs_m[:, None] * stride_dxt + offs_n[None, :] * stride_dxd,
        acc.to(dx_ptr.dtype.element_ty),
        mask=(offs_m < T)[:, None] & (offs_n < D)[None, :],
    )


@triton.jit
def _tile_coords(tile, n_m, n_n, GROUP_M: tl.constexpr):
    """(row block, column block) of output tile ``tile``, row blocks grouped by GROUP_M."""
    per_group = GROUP_M * n_n
    first_m = (tile // per_group) * GROUP_M
    group_size = tl.minimum(n_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % group_size, (tile % per_group) // group_size


@triton.jit
def _descriptor_tile(dy_desc, w_desc, dx_desc, tile, n_m, n_n, K, GROUP_M: tl.constexpr):
    """Output tile ``tile`` of the slice through tensor descriptors: its K loop, then its store."""
    BLOCK_M: tl.constexpr = dx_desc.block_shape[0]
    BLOCK_N: tl.constexpr = dx_desc.block_shape[1]
    BLOCK_K: tl.constexpr = dy_desc.block_shape[1]
    pid_m, pid_n = _tile_coords(tile, n_m, n_n, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = dy_desc.load([pid_m * BLOCK_M, k0])
        b = w_desc.load([k0, pid_n * BLOCK_N])
        acc = tl.dot(a, b, acc)
    dx_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(dx_desc.dtype))


@triton.jit
def _descriptor_zero_tile(dx_desc, zero, n_m, n_n):
    """Zero tile ``zero`` past the slice's ``n_m`` row blocks."""
    BLOCK_M: tl.constexpr = dx_desc.block_shape[0]
    BLOCK_N: tl.constexpr = dx_desc.block_shape[1]
    zeros = tl.zeros((BLOCK_M, BLOCK_N), dtype=dx_desc.dtype)
    dx_desc.store([(n_m + zero // n_n) * BLOCK_M, (zero % n_n) * BLOCK_N], zeros)


@triton.jit
def _fixed_slice_matmul_tma_kernel(
    dy_desc, w_desc, dx_desc, T, N_ROWS, K, D,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    PERSISTENT: tl.constexpr, FLATTEN: tl.constexpr,
):  # fmt: skip
    """The same product through tensor descriptors (dy_desc spans rows [0, N_ROWS) only). Each
    program walks the slice's output tiles with a stride of the grid, then stores its share of the
    zero tiles past the slice; PERSISTENT only tells the launcher to size the grid by the SMs."""
    start = tl.program_id(0)
    programs = tl.num_programs(0)
    n_m = tl.cdiv(N_ROWS, BLOCK_M)
    n_n = tl.cdiv(D, BLOCK_N)
    for tile in tl.range(start, n_m * n_n, programs, flatten=FLATTEN):
        _descriptor_tile(dy_desc, w_desc, dx_desc, tile, n_m, n_n, K, GROUP_M)
    for zero in range(start, (tl.cdiv(T, BLOCK_M) - n_m) * n_n, programs):
        _descriptor_zero_tile(dx_desc, zero, n_m, n_n)


@triton.jit
def _fixed_slice_matmul_short_kernel(
    dy_desc, w_desc, dx_desc, T, N_ROWS, K, D,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """A short slice: one program a tile of the slice, streaming its K range through a deep ring
    (the launch's ``num_stages``); the programs after the slice's store the zero tiles past it."""
    pid = tl.program_id(0)
    n_m = tl.cdiv(N_ROWS, BLOCK_M)
    n_n = tl.cdiv(D, BLOCK_N)
    if pid < n_m * n_n:
        _descriptor_tile(dy_desc, w_desc, dx_desc, pid, n_m, n_n, K, GROUP_M)
    else:
        _descriptor_zero_tile(dx_desc, pid - n_m * n_n, n_m, n_n)


# --- the warp-specialised Gluon kernel (Hopper): one output tile a program ---------------------------
# A load warp streams dy's and w's K tiles into a ring (TMA); three warpgroups each multiply 64 of the
# tile's 192 rows by its 128 columns (wgmma from shared memory), releasing a slot as soon as the
# product that read it is done. 192 x 128 tiles make bert-base's 4 096 x 768 intermediate dX 132
# tiles: one wave on 132 SMs, where 128 x 128 tiles make 192 (1.45 waves). (128 x 192 would make
# 128, but a TMA box's sides are powers of two.)


# The zero box's registers before it is stored to shared memory: 4 warps, 16 bytes a thread.
_ZERO_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))


@gluon.jit
def _ws_load(a_desc, b_desc, c_desc, a_bufs, b_bufs, zeros, ready, empty, row, col, n_k, zero_row, T, D,
             STAGES: gl.constexpr, WARPGROUPS: gl.constexpr):  # fmt: skip
    """The ring's loads, and the program's share of dx's zero boxes from row ``zero_row`` on, stored
    from ``zeros``: one with each K step, so that their writes spread over the K loop (16 384 rows,
    N = 4 096: 36.1 us, against 37.8 stored all before it and 38.9 as programs of their own after the
    slice's; diagnostics/zero_overlap)."""
    ROWS: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BOX: gl.constexpr = c_desc.block_type.shape
    box_cols = gl.cdiv(D, BOX[1])
    n_boxes = gl.cdiv(T - zero_row, BOX[0]) * box_cols
    box = gl.program_id(0)
    for i in range(n_k):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) + 1) & 1, pred=i >= STAGES)
        mbarrier.expect(ready.index(s), WARPGROUPS * a_desc.block_type.nbytes + b_desc.block_type.nbytes)
        for wg in gl.static_range(WARPGROUPS):
            tma.async_copy_global_to_shared(
                a_desc, [row + wg * ROWS, i * BLOCK_K], ready.index(s), a_bufs.index(s * WARPGROUPS + wg)
            )
        tma.async_copy_global_to_shared(b_desc, [i * BLOCK_K, col], ready.index(s), b_bufs.index(s))
        if box < n_boxes:
            tma.async_copy_shared_to_global(
                c_desc, [zero_row + (box // box_cols) * BOX[0], (box % box_cols) * BOX[1]], zeros
            )
        box += gl.num_programs(0)
    for rest in range(box, n_boxes, gl.num_programs(0)):
        tma.async_copy_shared_to_global(
            c_desc, [zero_row + (rest // box_cols) * BOX[0], (rest % box_cols) * BOX[1]], zeros
        )
    tma.store_wait(0)


@gluon.jit
def _ws_mma(a_bufs, b_bufs, ready, empty, c_desc, row, col, n_k, WG: gl.constexpr,
            WARPGROUPS: gl.constexpr):  # fmt: skip
    """Warpgroup ``WG``'s 64 rows of the tile: the K loop, then dx."""
    STAGES: gl.constexpr = b_bufs.shape[0]
    BLOCK_N: gl.constexpr = b_bufs.shape[2]
    ROWS: gl.constexpr = a_bufs.shape[1]
    acc = gl.zeros([ROWS, BLOCK_N], gl.float32, mma_layout(BLOCK_N))
    for i in range(n_k):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        acc = warpgroup_mma(a_bufs.index(s * WARPGROUPS + WG), b_bufs.index(s), acc, is_async=True)
        acc = warpgroup_mma_wait(1, deps=[acc])  # the product before this one is done: its slot is free
        if i > 0:
            mbarrier.arrive(empty.index((i - 1) % STAGES), count=1)
    acc = warpgroup_mma_wait(0, deps=[acc])
    # Stored by TMA from shared memory (which clips rows past T and columns past D), staged in this
    # warpgroup's own dy slots of stages 0 and 1: only its products read them, all are done, and no
    # load is left to write them. One 64-column half a slot; the staging needs no memory of its own,
    # which leaves room for the ring's fifth stage.
    halves = acc.to(c_desc.dtype).reshape([ROWS, 2, BLOCK_N // 2]).permute((0, 2, 1))
    low, high = gl.split(halves)
    a_bufs.index(WG).store(low)
    a_bufs.index(WARPGROUPS + WG).store(high)
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [row + WG * ROWS, col], a_bufs.index(WG))
    tma.async_copy_shared_to_global(
        c_desc, [row + WG * ROWS, col + BLOCK_N // 2], a_bufs.index(WARPGROUPS + WG)
    )
    tma.store_wait(0)


@gluon.jit
def _fixed_slice_matmul_ws_kernel(a_desc, b_desc, c_desc, T, N_ROWS, K, D, STAGES: gl.constexpr):
    """A 192 x BLOCK_N tile of the slice a program (a_desc spans rows [0, N_ROWS): the straddling
    block reads zeros past it); the rows of dx past the slice's row blocks are shared out over the
    programs as zero boxes of the store's shape."""
    ROWS: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    BOX: gl.constexpr = c_desc.block_type.shape
    WARPGROUPS: gl.constexpr = 3  # the three _ws_mma partitions below
    gl.static_assert(BOX[1] * 2 == BLOCK_N and STAGES >= 2)  # the staging in _ws_mma
    n_n = gl.cdiv(D, BLOCK_N)
    pid = gl.program_id(0)
    row = (pid // n_n) * (WARPGROUPS * ROWS)
    col = (pid % n_n) * BLOCK_N
    n_k = gl.cdiv(K, BLOCK_K)
    # One zeroed box of shared memory, which the load warp stores over dx's rows past the slice's row
    # blocks (written and fenced before the partitions start).
    zeros = gl.allocate_shared_memory(
        c_desc.dtype, BOX, c_desc.layout, gl.zeros(BOX, c_desc.dtype, _ZERO_LAYOUT)
    )
    fence_async_shared()
    zero_row = gl.cdiv(N_ROWS, WARPGROUPS * ROWS) * (WARPGROUPS * ROWS)
    a_bufs = gl.allocate_shared_memory(
        a_desc.dtype, [STAGES * WARPGROUPS] + a_desc.block_type.shape, a_desc.layout
    )
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=WARPGROUPS)  # every warpgroup's product reads the slot
    gl.warp_specialize(
        [
            (_ws_mma, (a_bufs, b_bufs, ready, empty, c_desc, row, col, n_k, 0, WARPGROUPS)),
            (_ws_mma, (a_bufs, b_bufs, ready, empty, c_desc, row, col, n_k, 1, WARPGROUPS)),
            (_ws_mma, (a_bufs, b_bufs, ready, empty, c_desc, row, col, n_k, 2, WARPGROUPS)),
            (_ws_load, (a_desc, b_desc, c_desc, a_bufs, b_bufs, zeros, ready, empty, row, col, n_k, zero_row,
                        T, D, STAGES, WARPGROUPS)),
        ],
        [4, 4, 1],
        [160, 160, 24],
    )  # fmt: skip


# The Gluon kernel's tile: 3 x 64 rows, 128 columns, K by 64, a 5-deep ring (200 KB of shared memory)
# and an 8 KB zero box.
_WS_ROWS, _WS_WARPGROUPS, _WS_BLOCK_N, _WS_BLOCK_K, _WS_STAGES = 64, 3, 128, 64, 5
# Where "auto" takes it (measured at bert-base's dX GEMMs on the H100, diagnostics/split_k/): the
# slice's 192 x 128 tiles make between 0.75 and 2 waves, over a long K (3 072: at K = 768 the Triton
# kernels' tiles ran faster at every N). At 16 384 rows, N = 4 096 (132 tiles) 40.1 us against the TMA
# kernel's 46.3, at N = 8 192 63.9 against 71.3; at N = 16 384 (3.9 waves) 118.2 against 114.3.
_WS_MIN_WAVES, _WS_MAX_WAVES, _WS_MIN_K = 0.75, 2.0, 2048


def _ws_tiles(rows: int, d: int) -> int:
    return cdiv(rows, _WS_WARPGROUPS * _WS_ROWS) * cdiv(d, _WS_BLOCK_N)


def _fixed_slice_matmul_ws(dy: Tensor, w: Tensor, dx: Tensor, n_rows: int) -> None:
    T, K = dy.shape
    D = w.shape[1]
    descriptors = (
        block_descriptor(dy[:n_rows], (_WS_ROWS, _WS_BLOCK_K)),
        block_descriptor(w, (_WS_BLOCK_K, _WS_BLOCK_N)),
        block_descriptor(dx, (_WS_ROWS, _WS_BLOCK_N // 2)),  # the store's halves, staged in dy's slots
    )
    _WS_LAUNCHES.launch(
        (signature_key(dy, w, dx), n_rows), descriptors, _fixed_slice_matmul_ws_kernel,
        (_ws_tiles(n_rows, D),), (T, n_rows, K, D), {"STAGES": _WS_STAGES, "num_warps": 4},
    )  # fmt: skip


# --- config space ---------------------------------------------------------------------------------
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages): the usual Hopper GEMM tiles for 16-bit inputs, and two
# smaller ones that 4-byte elements fit in shared memory with. The interpreter gets one small config
# (it cannot time; small blocks make the tests' odd shapes cross block edges).
_TILES = [
    (128, 256, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 128, 64, 4, 4),
    (64, 128, 64, 4, 4),
    (128, 64, 64, 4, 4),
]
_FALLBACK_TILES = [(128, 64, 32, 4, 3), (64, 64, 32, 4, 3)]
_CPU_TILES = [(32, 32, 32, 1, 1)]
_GROUP_M = 8


def _configs(tiles) -> list[triton.Config]:
    return [
        triton.Config(
            {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": _GROUP_M}, num_warps=w, num_stages=s
        )
        for m, n, k, w, s in tiles
    ]


def _smem(config: triton.Config, element_size: int) -> int:
    kw = config.kwargs
    tile = (kw["BLOCK_M"] + kw["BLOCK_N"]) * kw["BLOCK_K"]
    return tuning.pipelined_tile_bytes(tile, element_size, config.num_stages)


# The TMA kernel's (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, persistent, flatten): the tiles that led
# a sweep of 21 on the H100 at BERT-base's shapes (reports/data/sparse_ffn/diagnostics/), but for
# 128 x 256 at 4 stages, one program per tile: this kernel's sm_90a build needs 262 176 bytes of
# shared memory, past Hopper's 232 448.
_TMA_TILES = [
    (128, 256, 64, 8, 3, True, True),
    (128, 256, 64, 8, 3, True, False),
    (128, 256, 32, 8, 6, True, True),
    (128, 128, 64, 8, 5, True, True),
    (128, 128, 64, 4, 4, True, True),
    (128, 128, 64, 8, 3, False, False),
]
_CPU_TMA_TILES = [(32, 32, 32, 1, 1, True, True)]  # persistent: each program walks several tiles


def _set_tma_blocks(nargs: dict) -> None:
    """A config's tile shapes, given to the descriptors before it launches (autotuning included)."""
    m, n, k = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["dy_desc"].block_shape = [m, k]
    nargs["w_desc"].block_shape = [k, n]
    nargs["dx_desc"].block_shape = [m, n]


def _tma_smem(config: triton.Config, element_size: int) -> int:
    """The pipelined input tiles and the staging tile of dX's bulk store (within 0.1% of the sm_90a
    builds' shared memory for every tile above: tests/tritonlab/test_sparse_ffn.py)."""
    kw = config.kwargs
    return _smem(config, element_size) + kw["BLOCK_M"] * kw["BLOCK_N"] * element_size


def _descriptor_config(m: int, n: int, k: int, warps: int, stages: int, **flags) -> triton.Config:
    """A tile of the kernels that read and write through tensor descriptors (the TMA and short-slice
    kernels), ``flags`` their own constexprs; the descriptors take its block shapes before launch."""
    return triton.Config(
        {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": _GROUP_M, **flags},
        num_warps=warps, num_stages=stages, pre_hook=_set_tma_blocks,
    )  # fmt: skip


def _descriptor_autotune(kernel, configs: list[triton.Config], name: str, smem):
    """``kernel`` autotuned over ``configs`` pruned by ``smem`` (bytes of shared memory per config),
    keyed as every descriptor kernel here: rows and N bucket to powers of two; Hopper only."""
    return tuning_tables.autotune(
        configs,
        name=name,
        phase="sparse_ffn",
        key=["T", "N_ROWS", "K", "D"],
        dtype_arg="dy_desc",
        buckets={"T": tuning_tables.pow2_bucket, "N_ROWS": tuning_tables.pow2_bucket},
        runs_on_sm80=lambda config: False,
        prune_configs_by={"early_config_prune": shared_memory_pruner(smem, "dy_desc")},
    )(kernel)


_FALLBACK = [] if INTERPRET else _configs(_FALLBACK_TILES)
# Rows and N bucket to powers of two (the prune reads shared memory only), so a new batch or N in a
# tuned bucket launches the bucket's pick untimed.
_fixed_slice_matmul = tuning_tables.autotune(
    (_configs(_CPU_TILES) if INTERPRET else _configs(_TILES)) + _FALLBACK,
    name="sparse_ffn.fixed_slice_matmul",
    phase="sparse_ffn",
    key=["T", "N_ROWS", "K", "D", "DOT_PRECISION"],
    dtype_arg="dy_ptr",
    buckets={"T": tuning_tables.pow2_bucket, "N_ROWS": tuning_tables.pow2_bucket},
    prune_configs_by={"early_config_prune": shared_memory_pruner(_smem, "dy_ptr", _FALLBACK)},
)(_fixed_slice_matmul_kernel)


_fixed_slice_matmul_tma = _descriptor_autotune(
    _fixed_slice_matmul_tma_kernel,
    [
        _descriptor_config(m, n, k, w, s, PERSISTENT=p, FLATTEN=f)
        for m, n, k, w, s, p, f in (_CPU_TMA_TILES if INTERPRET else _TMA_TILES)
    ],
    "sparse_ffn.fixed_slice_matmul_tma",
    _tma_smem,
)

# The short-slice kernel's (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages): the deeper rings keep more of a
# short slice's loads in flight, where one program per SM streams its K range.
_SHORT_TILES = [
    (128, 128, 64, 4, 4),
    (128, 128, 64, 8, 4),
    (128, 128, 64, 4, 6),
    (64, 128, 64, 4, 4),
    (64, 128, 64, 4, 8),
    (64, 128, 128, 4, 4),
    (128, 64, 64, 4, 4),
    (128, 64, 64, 4, 8),
]
_CPU_SHORT_TILES = [(32, 32, 32, 1, 1)]


def _sms(t: Tensor) -> int:
    return sm_count(t.device) if t.is_cuda else 4  # the interpreter: a few programs a wave


_fixed_slice_matmul_short = _descriptor_autotune(
    _fixed_slice_matmul_short_kernel,
    [_descriptor_config(*tile) for tile in (_CPU_SHORT_TILES if INTERPRET else _SHORT_TILES)],
    "sparse_ffn.fixed_slice_matmul_short",
    _smem,
)

IMPLS = ("auto", "gluon", "short", "tma", "pointer")
# Per call signature (dy's and w's layouts, n_rows, the kernel; the dot precision, which follows
# torch's float32 setting): the compiled pick, launched directly after the signature's first call.
# Triton's autotuner and launcher cost about 0.1 ms of host time a call (phase sparse_ffn's host_ms).
_LAUNCHES = LaunchCache(autotune_for_launch)
# The Gluon kernel: compiled at a signature's first call, launched directly after it.
_WS_LAUNCHES = LaunchCache(first_launch)


def _tma_usable(dy: Tensor, w: Tensor, n_rows: int) -> bool:
    """Whether the TMA kernel can take this call: 16-bit operands a descriptor addresses, a slice
    that is not empty (a descriptor has no zero-length dimension) and a D whose rows of dx are
    16-byte multiples."""
    return (
        n_rows > 0
        and dy.dtype in (torch.bfloat16, torch.float16)
        and w.shape[1] * dy.element_size() % 16 == 0
        and tma_ok(dy, w)
    )


def _gluon_usable(dy: Tensor, w: Tensor, n_rows: int) -> bool:
    """Whether the Gluon kernel can take this call: the TMA kernel's operands on a Hopper GPU."""
    return not INTERPRET and dy.is_cuda and capability(dy.device)[0] == 9 and _tma_usable(dy, w, n_rows)


def _gluon_preferred(dy: Tensor, w: Tensor, n_rows: int) -> bool:
    """Where "auto" takes the Gluon kernel: a long K and a slice of 0.75 to 2 waves of its tiles."""
    waves = _ws_tiles(n_rows, w.shape[1]) / _sms(dy)
    return (
        _gluon_usable(dy, w, n_rows) and dy.shape[1] >= _WS_MIN_K and _WS_MIN_WAVES <= waves <= _WS_MAX_WAVES
    )


# Where "auto" takes the short-slice kernel: a slice of at most 1.5 waves of 128 x 128 tiles, where the
# persistent kernel's tiles leave SMs idle (diagnostics/split_k/, H100, at 2fa37f3 when it could also
# split K: bert-base's intermediate dX at 4 096 rows, N = 256-1 024, 18.5-23.2 us against 24.1-24.8;
# the output dX at N = 512-1 024, 15.9-18.1 against 18.1-21.2; at 384 tiles 27.6 against 24.9).
_SHORT_MAX_WAVES = 1.5


def _short_preferred(dy: Tensor, w: Tensor, n_rows: int) -> bool:
    return cdiv(n_rows, 128) * cdiv(w.shape[1], 128) <= _SHORT_MAX_WAVES * _sms(dy)


def _check_n_rows(n_rows, rows: int | None = None) -> int:
    if isinstance(n_rows, bool) or not isinstance(n_rows, int):
        raise ValueError(f"n_rows: expected an int, got {type(n_rows).__name__}")
    if n_rows < 0:
        raise ValueError(f"n_rows: must be >= 0, got {n_rows}")
    if rows is not None and n_rows > rows:
        raise ValueError(f"n_rows: {n_rows} is beyond the row count {rows} of dy")
    return n_rows


def fixed_slice_matmul(
    dy: Tensor, w: Tensor, n_rows: int, *, impl: str = "auto", record: ConfigRecord | None = None
) -> Tensor:
    """dx (T, D) with dx[:n_rows] = dy[:n_rows] @ w and dx[n_rows:] = 0 (exact zeros), in one launch.

    dy (T, K) and w (K, D) of one dtype (bf16, fp16 or fp32) on one device, any strides; n_rows in
    [0, T]. For a linear layer's weight W (D_OUT, D_IN), ``fixed_slice_matmul(dy, W, n)`` is the
    sliced dX. ``impl``: "auto" takes, on a Hopper GPU, the Gluon kernel over a long K where its
    192 x 128 tiles make 0.75 to 2 waves, the short-slice kernel where the slice's 128 x 128 tiles
    make at most 1.5 waves, else the TMA kernel where it can (see the module docstring); "pointer"
    never; "tma" and "short" wherever the operands allow them (the interpreter included, for tests);
    "gluon" on a Hopper GPU wherever "tma" could run (a ValueError where they cannot). ``record``
    receives the tiles of the kernel that ran (the autotuner's pick, or the Gluon kernel's), prefixed
    "short:" or "gluon:" for those two kernels.
    Numerically wrong as a training gradient for any n_rows < T (see the module docstring).
    """
    check_choice("impl", impl, IMPLS)
    check_tensor("dy", dy, ndim=2)
    check_tensor("w", w, ndim=2)
    check_same("w", w, "dy", dy, shape=False)
    if dy.shape[1] != w.shape[0]:
        raise ValueError(
            f"w: shape {tuple(w.shape)} does not match dy {tuple(dy.shape)}: expected w (K, D) with "
            f"K = dy.shape[1] = {dy.shape[1]}"
        )
    T, K = dy.shape
    D = w.shape[1]
    _check_n_rows(n_rows, T)
    check_offset_range("dy", T, max(K, D))
    if n_rows == 0 and impl == "auto":  # nothing to multiply: a memset (6.0 us against the pointer
        if record is not None:  # kernel's 7.5 at 4 096 x 768 on the H100)
            record.note("fixed_slice_matmul", "zeros")
        return torch.zeros((T, D), dtype=dy.dtype, device=dy.device)
    dx = torch.empty((T, D), dtype=dy.dtype, device=dy.device)
    if T == 0 or D == 0:
        return dx

    if impl == "gluon" and not _gluon_usable(dy, w, n_rows):
        raise ValueError(
            "impl: 'gluon' needs a Hopper GPU (compute capability 9.x) and the operands 'tma' needs: "
            f"bf16/fp16, unit inner strides, 16-byte aligned rows and n_rows > 0 (got {dy.dtype} on "
            f"{dy.device}, dy strides {dy.stride()}, w strides {w.stride()}, n_rows {n_rows})"
        )
    if impl == "gluon" or (impl == "auto" and _gluon_preferred(dy, w, n_rows)):
        _fixed_slice_matmul_ws(dy, w, dx, n_rows)
        if record is not None:
            record.note(
                "fixed_slice_matmul",
                f"gluon:BLOCK_M={_WS_WARPGROUPS * _WS_ROWS},BLOCK_N={_WS_BLOCK_N},BLOCK_K={_WS_BLOCK_K},stages={_WS_STAGES}",
            )
        return dx
    if impl in ("tma", "short") and not _tma_usable(dy, w, n_rows):
        raise ValueError(
            f"impl: {impl!r} needs bf16/fp16 operands with unit inner strides, 16-byte aligned rows and "
            f"n_rows > 0 (got {dy.dtype}, dy strides {dy.stride()}, w strides {w.stride()}, n_rows {n_rows})"
        )
    hopper_tma = (
        impl == "auto" and not INTERPRET and capability(dy.device)[0] >= 9 and _tma_usable(dy, w, n_rows)
    )
    use_short = impl == "short" or (hopper_tma and _short_preferred(dy, w, n_rows))
    use_tma = impl == "tma" or (hopper_tma and not use_short)

    def grid(meta):  # a program a tile (the short kernel's: the slice's and the zero tiles past it)
        tiles = cdiv(T, meta["BLOCK_M"]) * cdiv(D, meta["BLOCK_N"])
        return (min(tiles, sm_count(dy.device)) if meta.get("PERSISTENT") else tiles,)

    if use_tma or use_short:
        key = (signature_key(dy, w), n_rows, "short" if use_short else "tma")
        # The descriptors' block shapes are the pick's; before the first launch of a signature they
        # are placeholders, which each config's pre_hook sets while the autotuner runs.
        config = None if INTERPRET else _LAUNCHES.info(key)
        m, n, k = (config.kwargs[b] for b in ("BLOCK_M", "BLOCK_N", "BLOCK_K")) if config else (16, 16, 16)
        tensors = (
            TensorDescriptor(dy, [n_rows, K], [dy.stride(0), 1], [m, k]),
            TensorDescriptor.from_tensor(w, [k, n]),
            TensorDescriptor.from_tensor(dx, [m, n]),
        )
        shape_args = (T, n_rows, K, D)
        kernel, meta = (_fixed_slice_matmul_short if use_short else _fixed_slice_matmul_tma), {}
    else:
        precision = dot_precision(dy.dtype)
        key = (signature_key(dy, w), n_rows, precision)
        tensors = (dy, w, dx)
        shape_args = (T, n_rows, K, D, *dy.stride(), *w.stride(), *dx.stride())
        kernel, meta = _fixed_slice_matmul, {"DOT_PRECISION": precision}
    if INTERPRET:
        kernel[grid](*tensors, *shape_args, **meta)
        config = kernel.best_config
    else:
        config = _LAUNCHES.launch(key, tensors, kernel, grid, shape_args, meta)
    if record is not None:
        record.note("fixed_slice_matmul", f"short:{describe_config(config)}" if use_short else config)
    return dx


# --- autograd -------------------------------------------------------------------------------------


class _SlicedBackwardLinear(torch.autograd.Function):
    """Forward: ``F.linear`` (under autocast, in autocast's dtype, as nn.Linear). Backward: dX from
    the first n_rows rows of the flattened dY (``fixed_slice_matmul``); dW and db from all of dY."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, n_rows: int):
        ctx.compute_dtype = compute_dtype(x)
        ctx.n_rows = n_rows
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, weight = ctx.saved_tensors
        dtype = ctx.compute_dtype
        dy2 = dy.reshape(-1, dy.shape[-1]).to(dtype)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = fixed_slice_matmul(dy2, weight.to(dtype), ctx.n_rows)
            dx = dx.reshape(x.shape).to(x.dtype)
        if ctx.needs_input_grad[1]:
            dw = (dy2.t() @ x.reshape(-1, x.shape[-1]).to(dtype)).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(0, dtype=torch.float32).to(weight.dtype)
        return dx, dw, db, None


def sliced_backward_linear(x: Tensor, weight: Tensor, bias: Tensor | None, n_rows: int) -> Tensor:
    """``F.linear(x, weight, bias)`` whose backward keeps dX of the first ``n_rows`` flattened rows of x
    only (the rest zero); dW and db from the full upstream gradient. Numerically wrong for training."""
    _check_n_rows(n_rows)
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    if x.dim() == 0 or n_rows > rows:
        raise ValueError(f"n_rows: {n_rows} is beyond the row count {rows} of x {tuple(x.shape)}")
    return _SlicedBackwardLinear.apply(x, weight, bias, n_rows)


class SlicedBackwardLinear(nn.Linear):
    """An ``nn.Linear`` whose backward computes dX from the first ``n_rows`` rows of the flattened dY
    only (numerically WRONG for training; a measurement device). The forward is ``F.linear``, exactly.

    ``SlicedBackwardLinear.from_linear(linear, n_rows)`` shares ``linear``'s weight and bias (the same
    Parameter objects, so optimisers and state dicts see no difference).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, n_rows: int = 0, **kw):
        super().__init__(in_features, out_features, bias, **kw)
        self.n_rows = _check_n_rows(n_rows)

    @classmethod
    def from_linear(cls, linear: nn.Linear, n_rows: int) -> "SlicedBackwardLinear":
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"linear: expected an nn.Linear, got {type(linear).__name__}")
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.in_features, layer.out_features = linear.in_features, linear.out_features
        layer.weight = linear.weight
        layer.bias = linear.bias
        layer.n_rows = _check_n_rows(n_rows)
        layer.train(linear.training)
        return layer

    def forward(self, x: Tensor) -> Tensor:
        if not torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)
        return sliced_backward_linear(x, self.weight, self.bias, self.n_rows)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, n_rows={self.n_rows} (sliced dX: wrong for training)"


# --- Hugging Face models --------------------------------------------------------------------------


def _encoder_layers(model) -> list:
    """The encoder layers of a BERT or RoBERTa model, chosen by its config class."""
    try:
        from transformers import BertConfig, RobertaConfig
    except ImportError as e:  # pragma: no cover - the hf dependency group is missing
        raise ImportError("replace_ffn needs `transformers` (the project's `hf` dependency group)") from e
    config = getattr(model, "config", None)
    if not isinstance(config, BertConfig | RobertaConfig):
        kind = type(config).__name__ if config is not None else f"{type(model).__name__} without a config"
        raise ValueError(f"model: expected a Hugging Face BERT or RoBERTa model, got {kind}")
    base = getattr(model, "base_model", model)
    encoder = getattr(base, "encoder", None)
    layers = getattr(encoder, "layer", None)
    if layers is None:
        raise ValueError(f"model: {type(model).__name__} has no encoder.layer to replace FFN layers in")
    return list(layers)


def replace_ffn(model, n_rows: int, layers: int | Iterable[int] | None = None):
    """Replace ``intermediate.dense`` and ``output.dense`` of the chosen encoder layers of a Hugging
    Face BERT or RoBERTa ``model`` (any head: ``BertModel``, ``...ForSequenceClassification``…) by
    ``SlicedBackwardLinear`` layers with ``n_rows``, in place; returns ``model``.

    ``layers``: None for all, an index or indices in [0, num_hidden_layers). The parameters are
    shared, so the forward is unchanged, exactly; the backward's dX of those layers keeps the first
    ``n_rows`` flattened (batch·sequence) rows only -- numerically WRONG for training. Calling it
    again on a replaced model changes n_rows. ``n_rows`` beyond a batch's rows is a ValueError at the
    forward (with grad enabled: without it the layers are plain ``F.linear``).
    """
    _check_n_rows(n_rows)
    encoder_layers = _encoder_layers(model)
    count = len(encoder_layers)
    if layers is None:
        chosen = list(range(count))
    else:
        chosen = [layers] if isinstance(layers, int) else list(layers)
        for i in chosen:
            if isinstance(i, bool) or not isinstance(i, int):
                raise ValueError(f"layers: expected int indices, got {type(i).__name__}")
            if not 0 <= i < count:
                raise ValueError(f"layers: index {i} is out of range for a model of {count} layers")
    for i in chosen:
        layer = encoder_layers[i]
        layer.intermediate.dense = SlicedBackwardLinear.from_linear(layer.intermediate.dense, n_rows)
        layer.output.dense = SlicedBackwardLinear.from_linear(layer.output.dense, n_rows)
    return model
