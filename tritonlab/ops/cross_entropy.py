"""Cross-entropy over a large vocabulary: the loss and the gradient of the logits in one kernel.

For a row of logits x and target t: ``loss = logsumexp(x) - x[t]`` and
``dloss/dx = softmax(x) - onehot(t)``. Eager PyTorch upcasts the logits, writes a log-softmax,
reads it back for the loss and again for the gradient: several passes over rows x vocab values.
Here the forward, when the logits need a gradient, writes that gradient at once:

1. one sweep over the row with an *online* logsumexp (a running max and a running sum rescaled
   whenever the max grows), which also picks up ``x[t]``;
2. a second sweep writes ``(softmax(x) - onehot(t)) * scale``.

Sweep 1 prefetches: the next block's load is issued before the current block's max and sum
reductions, whose barriers would otherwise leave the SM idle while the load is in flight.

A persistent grid of one program per SM keeps only ~132 rows in flight; at 128 256 bf16 logits a
row is 250 KB, so the rows being worked on (33 MB) fit in H100's 50 MB L2 and the second sweep
reads from L2: device memory sees the logits read once and the gradient written once.

The scale is 1/(number of non-ignored targets) for ``reduction="mean"``, counted on the device by
a small kernel that also counts targets out of range. Those must raise a ``ValueError``, so the host
reads that count: copied to page-locked memory behind the small kernel, and waited for only after
the main kernel is queued, so the GPU never idles while the host checks. The upstream gradient
of the loss multiplies the stored gradient in the backward; that kernel skips rows whose factor is
exactly 1 (the usual ``loss.backward()``), so it costs nothing then.
Offsets are int64: rows x vocab may exceed 2**31.

Sweep 2 never compares a column with the target: it writes softmax * scale everywhere, then, after
a barrier, the target's element again with its one-hot term (``_store_target_grad``). The int64
comparison was 5 of the sweep's 16 instructions a logit (sm_90 SASS, bf16); without it the plain loss
takes 3.154 ms instead of 3.212 at 16384 x 128256 bf16 (H100, one process,
``reports/data/kernel_suite/diagnostics/ce_variants_102b7b1-h100.txt``).

The options (``_options_row``): label smoothing, the softcap (z = softcap * tanh(x / softcap)), the
z-loss and class weights. With a softcap up to ``SOFTCAP_FIXED_MAX`` sweep 1 takes the softcap as the
row's max and sums the exponentials per lane. The smoothing's sum of the logits is left to sweep 2,
which computes them anyway. The per-lane sums run over tiles that keep their rows inside each thread
(``_tile``), so they stay a few registers at the plain loss's 64 KB blocks, which every option now
runs. Against the plain loss in the same process (same file): smoothing 1.031x, the softcap 1.033x,
the z-loss 0.990x, every option on 1.007x; before, 1.071x, 1.058x, 1.018x, 1.081x.

Rows that are not whole 16-byte vectors (50 257 bf16 logits) are swept from the 16-byte boundary
before each row (``_row_span``, ``ALIGN``): the row's whole vectors in 16-byte loads and stores, its
few edge columns apart (``_edges``), where element-wise masks left every access at 2 bytes: 733
against 1248 us at 8192 x 50257 bf16, 777 against 1761 with every option (H100,
``reports/data/kernel_suite/diagnostics/ce_vector_rows_*``).

Launch settings (:class:`CrossEntropySettings`, swept by ``python -m phases kernel_suite --tune``):
each sweep-1 iteration moves ``block_bytes`` of logits -- 64 KB measured fastest at 16384 x 128256
bf16 on the H100 (3.60 ms against 3.95 ms at 32 KB: more bytes in flight per SM), so the block's
*element* count follows the element size (32 768 bf16 logits, 16 384 float32 ones: the same bytes
and registers per thread). Rows of at most ``SHORT_ROW_BYTES`` (32 000 or 50 257 bf16 logits) take
``SHORT_ROW_SETTINGS`` instead: two programs an SM, half the warps and half the block each, so that
one program's reductions overlap the other's loads (``settings_for``); the softcap on rows of at
most 64 KiB runs four programs an SM (``SOFTCAP_SHORT_ROW_SETTINGS``). A block halves where the row's
blocks would be more than ``MAX_BLOCK_PADDING`` padding. The interpreter runs small blocks faster.
On a GPU each kernel is compiled at the first call of a signature and launched directly after it
(``tritonlab._launch.launch``), except with class weights (see ``_launch``).
"""

import dataclasses
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .._launch import LaunchCache, first_launch, launch
from .._runtime import INTERPRET, next_power_of_2
from ..checks import as_rows, check_tensor, persistent_programs

# Above this softcap, exp(-2 * softcap) leaves float32's normal range: the fixed-max sweep stops there.
SOFTCAP_FIXED_MAX = 40.0
# The masked part of a row's last block still runs its exponentials: 50 257 bf16 logits in 32 KB
# blocks are 30% padding. Above this share a block is halved: 16 KB blocks took 8192 x 50257 from 733
# to 723 us (plain) and 778 to 716 (every option), 32 KB ones 4096 x 100277 from 785 to 777 and 757 to
# 727; halving again (14% padding) cost the plain loss 5.6% and 12% (H100, bf16, one process,
# reports/data/kernel_suite/diagnostics/ce_block_padding_*).
MAX_BLOCK_PADDING = 0.25


@dataclass(frozen=True)
class CrossEntropySettings:
    """``block_bytes``: logits per sweep-1 iteration, in bytes; ``num_warps``; ``programs_per_sm``:
    rows in flight per SM (their logits must stay in L2 for sweep 2: 0.5 per SM measured 6.28 ms,
    1 per SM 3.60 ms)."""

    block_bytes: int = 2048 if INTERPRET else 65536
    num_warps: int = 32
    programs_per_sm: float = 1.0
    # With a softcap up to SOFTCAP_FIXED_MAX: take it as the row's max (``_row_stats``).
    fixed_max: bool = True
    # Sweep 2 writes the target's element after the row, not through a comparison a logit.
    target_fixup: bool = True
    # Label smoothing with a gradient: the row's logit sum in sweep 2 (per lane, beside the gradient)
    # or in sweep 1 (beside the exponentials, in the block reductions; ``smoothing_in_sweep2``).
    smoothing_sum_sweep2: bool = True
    # Rows that are not whole 16-byte vectors swept from the boundary before them (``row_align``).
    vector_rows: bool = True
    # ptxas's register cap (``maxnreg``), so that ``programs_per_sm`` programs fit an SM's 64K
    # registers; None leaves the count to ptxas.
    max_registers: int | None = None

    def block_v(self, element_size: int, n_cols: int | None = None) -> int:
        """Logits a sweep iteration: ``block_bytes`` of them, halved while the row's blocks would be
        more than ``MAX_BLOCK_PADDING`` padding (down to one 16-byte vector a thread)."""
        block = next_power_of_2(max(16, self.block_bytes // element_size))
        one_vector_each = self.one_vector_each(element_size)
        while n_cols is not None and block > one_vector_each and -n_cols % block > MAX_BLOCK_PADDING * n_cols:
            block //= 2
        return block

    def one_vector_each(self, element_size: int) -> int:
        """Logits in one 16-byte vector for each of a program's threads."""
        return self.num_warps * 32 * max(1, 16 // element_size)

    def tile_cols(self, element_size: int, n_cols: int | None = None) -> int:
        """The columns of the tiles whose per-lane sums stay small (``_tile``: the fixed max's sweep 1,
        the smoothing's sweep 2): one 16-byte vector for each of the program's threads, at most the
        block."""
        return min(self.block_v(element_size, n_cols), self.one_vector_each(element_size))

    def uses_fixed_max(self, softcap: float | None) -> bool:
        """Whether the softcapped sweep takes the softcap as the row's max (``_row_stats``) here."""
        return self.fixed_max and softcap is not None and softcap <= SOFTCAP_FIXED_MAX

    def smoothing_in_sweep2(self, softcap: float | None, row_bytes: int) -> bool:
        """Whether label smoothing sums the logits in sweep 2 (``SWEEP2_SUM``): as the settings say,
        but always beside the fixed max (its sweep 1 spilled with the sum: every option on 1.10x at
        32 000 bf16 logits two programs an SM) and on rows not a multiple of 16 bytes (smoothing
        1.37x at 50 257 with element-wise sweeps; 1.007x with the sweep-2 sum and 16-byte ones), on
        the H100 (``reports/data/kernel_suite/diagnostics/ce_smoothing_sweep_*``, ``ce_vector_rows_*``)."""
        return self.smoothing_sum_sweep2 or self.uses_fixed_max(softcap) or row_bytes % 16 != 0

    def align(self, logits: torch.Tensor, grad: torch.Tensor) -> int:
        """The kernel's ``ALIGN``: ``row_align``'s, or 1 (element-wise sweeps) without ``vector_rows``."""
        return row_align(logits, grad) if self.vector_rows else 1

    def launch_options(self) -> dict:
        """The compiler's options of these settings, as ``kernel[grid]`` takes them."""
        options = {"num_warps": self.num_warps}
        if self.max_registers is not None:
            options["maxnreg"] = self.max_registers
        return options


DEFAULT_SETTINGS = CrossEntropySettings()
# Rows of at most SHORT_ROW_BYTES run two programs an SM, half the warps and half the block each: one
# program's reductions and special-function work overlap the other's loads, which a single program
# (one 64 KB block a row) leaves exposed: 9-13% faster at 32 000 bf16 logits, 2-16% at 50 257, 10%
# slower (plain) at 65 536 (H100, reports/data/kernel_suite/diagnostics/ce_short_rows_*). 64
# registers a thread fit both; the smoothing and the softcap took 116 and 84 without the cap, leaving
# room for one. Longer rows keep one program an SM, so that the rows in flight stay in L2 for sweep 2.
SHORT_ROW_SETTINGS = CrossEntropySettings(
    block_bytes=2048 if INTERPRET else 32768,
    num_warps=16,
    programs_per_sm=2.0,
    max_registers=64,
    # smoothing 1.023x the plain loss (sweep 2: 1.062x) at 4096 x 32000, 1.003x at 16384 x 32000
    smoothing_sum_sweep2=False,
)
SHORT_ROW_BYTES = 100 * 1024
# The softcap's fixed max on rows of at most SOFTCAP_SHORT_ROW_BYTES: four programs an SM of 8 warps and
# 16 KB blocks. Its sweeps are bound by the special-function unit (a tanh and an exponential a logit
# each), and more rows in flight keep it busier: every option on 4096 x 32000 in 223.4 us against
# 230.6 with two programs, the softcap alone 223.3 against 226.4 (the plain loss, which these settings
# slow from 218 to 230 us, keeps its own). At 50 257 logits four programs lost (every option 792 against
# 716 us at 16 KB blocks): their rows, 53 MB in flight, no longer fit the 50 MB L2 for sweep 2
# (H100, reports/data/kernel_suite/diagnostics/ce_short_options_settings_*).
SOFTCAP_SHORT_ROW_SETTINGS = dataclasses.replace(
    SHORT_ROW_SETTINGS, block_bytes=2048 if INTERPRET else 16384, num_warps=8, programs_per_sm=4.0
)
SOFTCAP_SHORT_ROW_BYTES = 64 * 1024


def settings_for(n_cols: int, element_size: int, softcap: float | None = None) -> CrossEntropySettings:
    """The launch settings of rows of ``n_cols`` logits of ``element_size`` bytes (and ``softcap``)."""
    row_bytes = n_cols * element_size
    if softcap is not None and softcap <= SOFTCAP_FIXED_MAX and row_bytes <= SOFTCAP_SHORT_ROW_BYTES:
        return SOFTCAP_SHORT_ROW_SETTINGS
    return SHORT_ROW_SETTINGS if row_bytes <= SHORT_ROW_BYTES else DEFAULT_SETTINGS


def row_align(logits: torch.Tensor, grad: torch.Tensor) -> int:
    """The kernel's ``ALIGN`` for these (rows, columns) logits and their gradient: 1 where every row
    starts on a 16-byte boundary and spans whole 16-byte vectors (the sweeps then vectorise as
    written); otherwise the elements of a 16-byte vector, so that each row is swept from the 16-byte
    boundary before it (``_row_span``), provided both start on 16-byte boundaries and the gradient's
    rows sit as far from one as the logits' (the same row stride modulo a vector). The rows of a
    50 257-word vocabulary are not whole vectors; 1 then leaves the sweeps to 2-byte accesses."""
    vec = 16 // logits.element_size()
    if logits.stride(0) % vec == 0 and logits.shape[1] % vec == 0 and logits.data_ptr() % 16 == 0:
        return 1
    if logits.data_ptr() % 16 or grad.data_ptr() % 16 or (logits.stride(0) - grad.stride(0)) % vec:
        return 1
    return vec


def fast_tanh(dtype: torch.dtype) -> bool:
    """Whether the softcap's tanh runs as the GPU's approximate instruction (``_tanh``): for 16-bit
    logits on a GPU. Its exp-and-reciprocal form made the softcap the kernel's bound: 6 special-
    function ops a logit against the plain loss's 2 (sm_90 SASS), 1.98x its kernel time at
    4096 x 32000 bf16 on the H100; the instruction makes it 4."""
    return not INTERPRET and dtype.itemsize == 2


_FTZ_EXP = tl.constexpr(not INTERPRET)
LOG2E = tl.constexpr(1.4426950408889634)
_SCALE_BLOCK = 512 if INTERPRET else 4096


# The compiled kernels per call signature, launched directly after its first call (tritonlab._launch).
_LAUNCHES = LaunchCache(first_launch)


def _launch(kernel, grid: tuple, tensors: tuple, scalars: tuple, constexprs: dict) -> None:
    """``kernel[grid](*tensors, *scalars, **constexprs)``, launched directly after the first call of a
    signature -- but through Triton's launcher where the class weights put tensors among the keyword
    arguments (they follow the constexprs in the kernels' parameters): a direct launch would replay
    those from its first call."""
    if constexprs.get("WEIGHT") is None:
        launch(_LAUNCHES, kernel, grid, tensors, scalars, constexprs)
    else:
        kernel[grid](*tensors, *scalars, **constexprs)


@triton.jit
def _row_span(BASE, row, stride, n_cols, ALIGN: tl.constexpr):
    """Where row ``row`` of BASE lies, as (pointer, lead, a0, a1, end) in *aligned columns*: column
    ``lead + c`` of the pointer is the row's column c, the pointer sits on a 16-byte boundary, and
    [a0, a1) are the whole 16-byte vectors inside the row ([lead, end) is the row). With ``ALIGN``
    (the elements of a 16-byte vector; 1 for rows that start and end on 16-byte boundaries, where
    the row is the span itself) the sweeps' masks over [a0, a1) hold for whole vectors, so their
    loads and stores vectorise; the row's few columns outside it, at most ALIGN - 1 at each end,
    go through ``_edges``."""
    off = tl.cast(row, tl.int64) * stride
    if ALIGN > 1:
        lead = (off % ALIGN).to(tl.int32)  # columns within a row fit 32 bits, as n_cols does
        end = lead + n_cols
        a0 = tl.multiple_of((lead + ALIGN - 1) // ALIGN * ALIGN, ALIGN)
        a1 = tl.multiple_of(end // ALIGN * ALIGN, ALIGN)
        return BASE + tl.multiple_of(off - lead, ALIGN), lead, a0, a1, end
    else:
        return BASE + off, 0, 0, n_cols, n_cols


@triton.jit
def _interior(cols, a0, a1, ALIGN: tl.constexpr):
    """Which of ``cols`` (aligned columns) lie in the row's whole vectors [a0, a1)."""
    if ALIGN > 1:
        return (cols >= a0) & (cols < a1)
    else:
        return cols < a1


@triton.jit
def _edges(lead, a0, a1, end, ALIGN: tl.constexpr):
    """The aligned columns of the row outside its whole vectors -- [lead, a0) and [a1, end), clipped
    where the row is shorter than a vector -- as a [2 * ALIGN] block and its mask."""
    idx = tl.arange(0, 2 * ALIGN)
    head = idx < ALIGN
    cols = tl.where(head, lead + idx, tl.maximum(a0, a1) + idx - ALIGN)
    return cols, tl.where(head, cols < tl.minimum(a0, end), cols < end)


@triton.jit
def _merge_lse(max_a, sum_a, max_b, sum_b):
    """Two (max, sum of exp(x - max)) pairs as one; a part with no element (max -inf) adds nothing."""
    new_max = tl.maximum(max_a, max_b)
    part_a = tl.where(max_a == float("-inf"), 0.0, sum_a * tl.exp(max_a - new_max))
    part_b = tl.where(max_b == float("-inf"), 0.0, sum_b * tl.exp(max_b - new_max))
    return new_max, part_a + part_b


@triton.jit
def _row_logsumexp(row_logits, lead, a0, a1, end, BLOCK_V: tl.constexpr, ALIGN: tl.constexpr):
    """Running max and sum per block: the max only grows, the sum is rescaled with it. Each block's
    load is issued one iteration ahead, so its latency overlaps the reductions (and their barriers)
    of the block before; the last prefetch is fully masked. The row's edges (``_edges``) join once,
    after the sweep."""
    running_max = float("-inf")
    running_sum = 0.0
    cols = tl.arange(0, BLOCK_V)
    x = tl.load(
        row_logits + cols,
        mask=_interior(cols, a0, a1, ALIGN),
        other=float("-inf"),
        eviction_policy="evict_last",
    )
    for start in range(BLOCK_V, a1 + BLOCK_V, BLOCK_V):
        next_cols = start + tl.arange(0, BLOCK_V)
        x_next = tl.load(
            row_logits + next_cols,
            mask=_interior(next_cols, a0, a1, ALIGN),
            other=float("-inf"),
            eviction_policy="evict_last",
        )
        xf = x.to(tl.float32)
        new_max = tl.maximum(running_max, tl.max(xf, axis=0))
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(xf - new_max), axis=0)
        running_max = new_max
        x = x_next
    if ALIGN > 1:
        edge_cols, edge_mask = _edges(lead, a0, a1, end, ALIGN)
        xe = tl.load(row_logits + edge_cols, mask=edge_mask, other=float("-inf")).to(tl.float32)
        edge_max = tl.max(xe, axis=0)
        edge_sum = tl.sum(tl.where(edge_mask, tl.exp(xe - edge_max), 0.0), axis=0)
        running_max, running_sum = _merge_lse(running_max, running_sum, edge_max, edge_sum)
    return running_max + tl.log(running_sum)


@triton.jit
def _cross_entropy_fwd_kernel(
    LOGITS,
    TARGET,
    LOSS,
    GRAD,
    N_VALID,
    n_rows,
    n_cols,
    stride_logits,
    stride_grad,
    ignore_index,
    MEAN: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    BLOCK_V: tl.constexpr,
    # The options: all off (the defaults, None / 0.0) specialise to exactly the kernel above them.
    WEIGHT=None,
    WEIGHT_STATS=None,
    smoothing=0.0,
    softcap=1.0,
    lse_square_scale=0.0,
    HAS_WEIGHT: tl.constexpr = False,
    HAS_SMOOTHING: tl.constexpr = False,
    HAS_SOFTCAP: tl.constexpr = False,
    HAS_ZLOSS: tl.constexpr = False,
    FAST_TANH: tl.constexpr = False,
    FIXED_MAX: tl.constexpr = False,
    TARGET_FIXUP: tl.constexpr = True,
    TILE_COLS: tl.constexpr = None,
    SWEEP2_SUM: tl.constexpr = True,
    ALIGN: tl.constexpr = 1,
):
    # ALIGN > 1 (``row_align``): the rows are not whole 16-byte vectors; the gradient's rows start
    # as far from a 16-byte boundary as the logits' (the same lead, a0, a1 and end).
    inv_n = 1.0 / tl.load(N_VALID).to(tl.float32) if MEAN else 1.0
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row_logits, lead, a0, a1, end = _row_span(LOGITS, row, stride_logits, n_cols, ALIGN)
        row_grad = _row_span(GRAD, row, stride_grad, n_cols, ALIGN)[0]
        target = tl.load(TARGET + row).to(tl.int64)
        ignored = target == ignore_index
        if HAS_WEIGHT or HAS_SMOOTHING or HAS_SOFTCAP or HAS_ZLOSS:
            _options_row(
                row_logits, row_grad, lead, a0, a1, end, target, ignored, row, LOSS, WEIGHT, WEIGHT_STATS,
                inv_n, n_cols, smoothing, softcap, lse_square_scale, MEAN, COMPUTE_GRAD, BLOCK_V, TILE_COLS,
                HAS_WEIGHT, HAS_SMOOTHING, HAS_SOFTCAP, HAS_ZLOSS, FAST_TANH, FIXED_MAX, TARGET_FIXUP, SWEEP2_SUM,
                ALIGN,
            )  # fmt: skip
        else:
            _plain_row(
                row_logits, row_grad, lead, a0, a1, end, target, ignored, row, LOSS, inv_n, n_cols,
                COMPUTE_GRAD, BLOCK_V, TARGET_FIXUP, ALIGN,
            )  # fmt: skip


@triton.jit
def _plain_row(
    row_logits, row_grad, lead, a0, a1, end, target, ignored, row, LOSS, inv_n, n_cols,
    COMPUTE_GRAD, BLOCK_V, TARGET_FIXUP, ALIGN,
):  # fmt: skip
    """One row without options: ``loss = lse - x[t]``, ``grad = (softmax(x) - onehot(t)) * scale``."""
    # Sweep 1: online logsumexp.
    lse = _row_logsumexp(row_logits, lead, a0, a1, end, BLOCK_V, ALIGN)
    # A target out of range is never read; its row's loss and gradient become NaN, and the
    # host raises unless the caller turned the check off.
    bad = ~ignored & ((target < 0) | (target >= n_cols))
    t_col = lead + target
    x_target = tl.load(row_logits + t_col, mask=~ignored & ~bad, other=float("nan")).to(tl.float32)
    tl.store(LOSS + row, tl.where(ignored, 0.0, lse - x_target))
    if COMPUTE_GRAD:
        scale = tl.where(ignored, 0.0, tl.where(bad, float("nan"), inv_n))
        # Sweep 2: the row is still in L2; write the gradient once.
        for start in range(0, a1, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            mask = _interior(cols, a0, a1, ALIGN)
            # (a new name: reusing sweep 1's `x` would make it a loop-carried variable of another type)
            logit = tl.load(row_logits + cols, mask=mask, other=0.0, eviction_policy="evict_first")
            g = tl.exp(logit.to(tl.float32) - lse) * scale
            if not TARGET_FIXUP:
                g = tl.where(cols == t_col, g - scale, g)
            tl.store(
                row_grad + cols, g.to(row_grad.dtype.element_ty), mask=mask, eviction_policy="evict_first"
            )
        if ALIGN > 1:
            cols, mask = _edges(lead, a0, a1, end, ALIGN)
            g = tl.exp(tl.load(row_logits + cols, mask=mask, other=0.0).to(tl.float32) - lse) * scale
            if not TARGET_FIXUP:
                g = tl.where(cols == t_col, g - scale, g)
            tl.store(row_grad + cols, g.to(row_grad.dtype.element_ty), mask=mask)
        if TARGET_FIXUP:
            _store_target_grad(row_grad, t_col, ~ignored & ~bad, (tl.exp(x_target - lse) - 1.0) * scale)


@triton.jit
def _store_target_grad(row_grad, t_col, read, g_target):
    """Sweep 2 writes every column without the one-hot term (no per-logit comparison with the
    target: with an int64 target that was 4-5 instructions a logit of the sweep's ~16 in the sm_90
    SASS); the target's element is then written again, with it, after a barrier: ``bar.sync``
    orders the program's global stores, so this store lands after the sweep's store of the same
    element by whichever thread made it."""
    tl.debug_barrier()
    tl.store(row_grad + t_col, g_target.to(row_grad.dtype.element_ty), mask=read)


@triton.jit
def _tanh(u, FAST_TANH: tl.constexpr):
    """tanh(u). ``FAST_TANH``: the GPU's ``tanh.approx.f32``, one special-function op, relative error
    about 2**-11 (PTX ISA), under the 2**-9 rounding of the 16-bit logits it is used for. Otherwise
    1 - 2 / (exp(2u) + 1): an exp and a reciprocal, exact limits +-1 at +-inf, no libdevice call (the
    interpreter runs it), float32-accurate."""
    if FAST_TANH:
        return tl.inline_asm_elementwise(
            "tanh.approx.f32 $0, $1;", "=r,r", [u], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)


@triton.jit
def _exp2(x):
    """2**x as ``ex2.approx.ftz.f32`` on a GPU, for the softcapped sweeps: ``tl.exp2`` builds the
    non-ftz instruction, which sm_90 SASS wraps in a compare and two predicated multiplies (for
    results below 2**-126, which neither the sums nor the gradients need). Every option on, 3.50 ms
    against 3.55 with ``tl.exp`` (H100, 16384 x 128256 bf16); without the softcap the same
    instruction made the z-loss and smoothing kernels 7-10% slower (3.50 against 3.17 ms, 3.35 against
    3.13: ``reports/data/kernel_suite/diagnostics/``), so the other sweeps keep ``tl.exp``. The
    interpreter keeps ``tl.exp2``."""
    if _FTZ_EXP:
        return tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return tl.exp2(x)


@triton.jit
def _softcapped(x, softcap, mask, HAS_SOFTCAP: tl.constexpr, FAST_TANH: tl.constexpr):
    """z = softcap * tanh(x / softcap) where ``mask``, -inf elsewhere; without a softcap z = x."""
    if HAS_SOFTCAP:
        t = _tanh(x * (1.0 / softcap), FAST_TANH)  # one reciprocal, not a division per logit
        z = tl.where(mask, softcap * t, float("-inf"))
    else:
        z = x
    return z


@triton.jit
def _add_pair(a, b, c, d):
    return a + c, b + d


@triton.jit
def _row_stats(
    row_logits, lead, a0, a1, end, WEIGHT, softcap, BLOCK_V, TILE_COLS, HAS_WEIGHT, SUM_Z, HAS_SOFTCAP,
    FAST_TANH, FIXED_MAX, ALIGN,
):  # fmt: skip
    """Sweep 1 with options: (logsumexp(z), sum over classes of w_c * z_c) for z the (softcapped)
    logits; the sum only with ``SUM_Z`` (label smoothing without a gradient: with one, sweep 2 takes
    it), w_c = 1 without a weight. Prefetches like ``_row_logsumexp``, whose running max it keeps --
    except with ``FIXED_MAX`` (the softcap): z = softcap * tanh(x / softcap) never exceeds the
    softcap, so that is the max: no running max, no rescaling, and the exponentials' sum accumulates
    per lane, reduced once a row instead of once a block (no barrier left in the sweep).
    exp(z - softcap) >= exp(-2 softcap) stays a normal float32 while softcap <= SOFTCAP_FIXED_MAX.

    The fixed max's blocks are [BLOCK_V // TILE_COLS, TILE_COLS] tiles of the row (``_tile``), so its
    per-lane sums are [TILE_COLS] vectors: 8 float32 registers a thread for bf16 at 32 warps, which
    lets it run the plain loss's 64 KB blocks without spilling (a [BLOCK_V] vector is 32). The running
    max stays one-dimensional: reduced in two steps over a tile, it spilled (sm_90 ptxas) and the
    z-loss alone took 4.90 ms against 3.28 (H100, 16384 x 128256 bf16,
    reports/data/kernel_suite/diagnostics/ce_variants_dd0b157-h100.txt). Columns are aligned ones
    (``_row_span``); the row's edges join after the sweep."""
    offs = _tile(BLOCK_V, TILE_COLS) if FIXED_MAX else tl.arange(0, BLOCK_V)
    x = tl.load(
        row_logits + offs,
        mask=_interior(offs, a0, a1, ALIGN),
        other=float("-inf"),
        eviction_policy="evict_last",
    )
    lane_exp = tl.zeros([TILE_COLS], dtype=tl.float32)
    lane_t = tl.zeros([TILE_COLS], dtype=tl.float32)
    cap_log2 = softcap * LOG2E
    running_max = float("-inf")
    running_sum = 0.0
    weighted_z = 0.0
    for start in range(BLOCK_V, a1 + BLOCK_V, BLOCK_V):
        x_next = tl.load(
            row_logits + start + offs,
            mask=_interior(offs, a0 - start, a1 - start, ALIGN),
            other=float("-inf"),
            eviction_policy="evict_last",
        )
        cols = (start - BLOCK_V) + offs
        mask = _interior(cols, a0, a1, ALIGN)
        if FIXED_MAX:
            # exp(z - softcap) = 2**(t * softcap * log2(e) - softcap * log2(e)): one FMA before the exp2
            t = _tanh(x.to(tl.float32) * (1.0 / softcap), FAST_TANH)
            lane_exp += tl.sum(tl.where(mask, _exp2(t * cap_log2 - cap_log2), 0.0), axis=0)
            if SUM_Z:
                ts = tl.where(mask, t, 0.0)  # the softcap's factor goes on once, at the end
                if HAS_WEIGHT:
                    ts *= tl.load(WEIGHT + (cols - lead), mask=mask, other=0.0).to(tl.float32)
                lane_t += tl.sum(ts, axis=0)
        else:
            z = _softcapped(x.to(tl.float32), softcap, mask, HAS_SOFTCAP, FAST_TANH)
            new_max = tl.maximum(running_max, tl.max(z, axis=0))
            if SUM_Z:
                # One two-operand reduction for the exponentials' and the logits' sums: one pass through
                # shared memory and its barriers instead of two.
                zs = tl.where(mask, z, 0.0)
                if HAS_WEIGHT:
                    zs *= tl.load(WEIGHT + (cols - lead), mask=mask, other=0.0).to(tl.float32)
                block_sum, block_z = tl.reduce((tl.exp(z - new_max), zs), 0, _add_pair)
                weighted_z += block_z
            else:
                block_sum = tl.sum(tl.exp(z - new_max), axis=0)
            running_sum = running_sum * tl.exp(running_max - new_max) + block_sum
            running_max = new_max
        x = x_next
    if FIXED_MAX:
        if SUM_Z:
            sum_exp, sum_t = tl.reduce((lane_exp, lane_t), 0, _add_pair)
        else:
            sum_exp = tl.sum(lane_exp, axis=0)
            sum_t = 0.0
    if ALIGN > 1:
        cols, mask = _edges(lead, a0, a1, end, ALIGN)
        xe = tl.load(row_logits + cols, mask=mask, other=0.0).to(tl.float32)
        we = tl.load(WEIGHT + (cols - lead), mask=mask, other=0.0).to(tl.float32) if HAS_WEIGHT else 1.0
        if FIXED_MAX:
            te = _tanh(xe * (1.0 / softcap), FAST_TANH)
            sum_exp += tl.sum(tl.where(mask, _exp2(te * cap_log2 - cap_log2), 0.0), axis=0)
            if SUM_Z:
                sum_t += tl.sum(tl.where(mask, te * we, 0.0), axis=0)
        else:
            ze = _softcapped(xe, softcap, mask, HAS_SOFTCAP, FAST_TANH)
            ze = tl.where(mask, ze, float("-inf"))
            edge_max = tl.max(ze, axis=0)
            edge_sum = tl.sum(tl.where(mask, tl.exp(ze - edge_max), 0.0), axis=0)
            running_max, running_sum = _merge_lse(running_max, running_sum, edge_max, edge_sum)
            if SUM_Z:
                weighted_z += tl.sum(tl.where(mask, ze * we, 0.0), axis=0)
    if FIXED_MAX:
        if SUM_Z:
            weighted_z = softcap * sum_t
        lse = softcap + tl.log(sum_exp)
    else:
        lse = running_max + tl.log(running_sum)
    return lse, weighted_z


@triton.jit
def _tile(BLOCK_V: tl.constexpr, TILE_COLS: tl.constexpr):
    """Offsets r * TILE_COLS + c of a [BLOCK_V // TILE_COLS, TILE_COLS] tile over a contiguous block,
    TILE_COLS the columns one pass of the program's threads covers with 16-byte vectors: Triton's
    blocked layout then keeps the tile's rows inside each thread, and a sum over axis 0 is adds within
    the thread."""
    return tl.arange(0, BLOCK_V // TILE_COLS)[:, None] * TILE_COLS + tl.arange(0, TILE_COLS)[None, :]


@triton.jit
def _options_row(
    row_logits, row_grad, lead, a0, a1, end, target, ignored, row, LOSS, WEIGHT, WEIGHT_STATS,
    inv_n, n_cols, smoothing, softcap, lse_square_scale, MEAN, COMPUTE_GRAD, BLOCK_V, TILE_COLS,
    HAS_WEIGHT, HAS_SMOOTHING, HAS_SOFTCAP, HAS_ZLOSS, FAST_TANH, FIXED_MAX, TARGET_FIXUP, SWEEP2_SUM,
    ALIGN,
):  # fmt: skip
    """One row with options, z the (softcapped) logits, w the class weights (1 without), eps the
    smoothing, C = n_cols, W = sum of w:

        loss = (1 - eps) * w_t * (lse - z_t) + eps / C * (W * lse - sum_c w_c z_c)   [F.cross_entropy]
        dloss/dz_c = ((1 - eps) * w_t + eps / C * W) * p_c - (1 - eps) * w_t * [c == t] - eps / C * w_c

    both times the mean's 1 / (sum of w_t over counted rows); the z-loss adds scale * lse**2 to the
    row's loss and 2 * scale * lse * p_c to its gradient, averaged over the counted rows by the mean.
    The softcap's derivative, 1 - tanh**2, multiplies the gradient of z.

    The smoothing's sum of w_c z_c is needed by the loss alone, not by the gradient: with a gradient,
    sweep 2, which computes z_c anyway, adds it up per lane over [BLOCK_V // TILE_COLS, TILE_COLS]
    tiles (one add a logit, a [TILE_COLS] accumulator; the columns past the row load as 0, whose z is
    0: no mask) and the loss is stored after it; sweep 1 is then the loss without smoothing's. Without
    ``SWEEP2_SUM`` sweep 1 adds the sum up in both cases."""
    if COMPUTE_GRAD:
        lse, weighted_z = _row_stats(
            row_logits, lead, a0, a1, end, WEIGHT, softcap, BLOCK_V, TILE_COLS, HAS_WEIGHT,
            HAS_SMOOTHING and not SWEEP2_SUM, HAS_SOFTCAP, FAST_TANH, FIXED_MAX, ALIGN,
        )  # fmt: skip
    else:
        lse, weighted_z = _row_stats(
            row_logits, lead, a0, a1, end, WEIGHT, softcap, BLOCK_V, TILE_COLS, HAS_WEIGHT, HAS_SMOOTHING,
            HAS_SOFTCAP, FAST_TANH, FIXED_MAX, ALIGN,
        )  # fmt: skip
    bad = ~ignored & ((target < 0) | (target >= n_cols))
    read = ~ignored & ~bad
    t_col = lead + target
    x_target = tl.load(row_logits + t_col, mask=read, other=float("nan")).to(tl.float32)
    z_target = _softcapped(x_target, softcap, read, HAS_SOFTCAP, FAST_TANH)
    z_target = tl.where(read, z_target, float("nan"))
    w_target = tl.load(WEIGHT + target, mask=read, other=0.0).to(tl.float32) if HAS_WEIGHT else 1.0
    ce_scale = inv_n
    if HAS_WEIGHT and MEAN:
        ce_scale = 1.0 / tl.load(WEIGHT_STATS + 1)
    n_cols_f = n_cols * 1.0  # (n_cols == 1 arrives as a constexpr)
    if HAS_SMOOTHING:
        w_total = tl.load(WEIGHT_STATS).to(tl.float32) if HAS_WEIGHT else n_cols_f
        hit = (1.0 - smoothing) * w_target
        p_factor = hit + smoothing / n_cols_f * w_total
    else:
        hit = w_target
        p_factor = hit
    if COMPUTE_GRAD:
        # Ignored rows get exactly 0 (the mean's scale is inf when every row is ignored), bad rows NaN.
        grad_scale = tl.where(ignored, 0.0, tl.where(bad, float("nan"), ce_scale))
        p_scale = p_factor * grad_scale
        if HAS_ZLOSS:
            z_scale = tl.where(ignored, 0.0, tl.where(bad, float("nan"), inv_n))
            p_scale += 2.0 * lse_square_scale * lse * z_scale
        hit_scale = hit * grad_scale
        spread = smoothing / n_cols_f * grad_scale
        cap_log2 = softcap * LOG2E
        lse_log2 = lse * LOG2E
        offs = _tile(BLOCK_V, TILE_COLS) if HAS_SMOOTHING and SWEEP2_SUM else tl.arange(0, BLOCK_V)
        lane_z = tl.zeros([TILE_COLS], dtype=tl.float32)
        for start in range(0, a1, BLOCK_V):
            cols = start + offs
            mask = _interior(cols, a0, a1, ALIGN)
            logit = tl.load(row_logits + cols, mask=mask, other=0.0, eviction_policy="evict_first")
            g, zs = _options_grad(
                logit, cols, mask, lead, t_col, WEIGHT, lse, softcap, cap_log2, lse_log2, p_scale, hit_scale,
                spread, HAS_WEIGHT, HAS_SMOOTHING, HAS_SOFTCAP, FAST_TANH, TARGET_FIXUP,
            )  # fmt: skip
            if HAS_SMOOTHING and SWEEP2_SUM:
                lane_z += tl.sum(zs, axis=0)
            tl.store(
                row_grad + cols, g.to(row_grad.dtype.element_ty), mask=mask, eviction_policy="evict_first"
            )
        if ALIGN > 1:
            cols, mask = _edges(lead, a0, a1, end, ALIGN)
            logit = tl.load(row_logits + cols, mask=mask, other=0.0)
            g, zs = _options_grad(
                logit, cols, mask, lead, t_col, WEIGHT, lse, softcap, cap_log2, lse_log2, p_scale, hit_scale,
                spread, HAS_WEIGHT, HAS_SMOOTHING, HAS_SOFTCAP, FAST_TANH, TARGET_FIXUP,
            )  # fmt: skip
            if HAS_SMOOTHING and SWEEP2_SUM:
                edge_z = tl.sum(zs, axis=0)  # the masked columns loaded 0: z = 0 (and w = 0)
            tl.store(row_grad + cols, g.to(row_grad.dtype.element_ty), mask=mask)
        if HAS_SMOOTHING and SWEEP2_SUM:
            weighted_z = tl.sum(lane_z, axis=0)
            if ALIGN > 1:
                weighted_z += edge_z
            if HAS_SOFTCAP:
                weighted_z *= softcap
        if TARGET_FIXUP:
            # The target's element, from the same formula on its logit (read before this sweep).
            if HAS_SOFTCAP:
                t_target = _tanh(x_target * (1.0 / softcap), FAST_TANH)
                g_target = _exp2(t_target * cap_log2 - lse_log2) * p_scale - hit_scale
            else:
                g_target = tl.exp(x_target - lse) * p_scale - hit_scale
            if HAS_SMOOTHING:
                if HAS_WEIGHT:
                    g_target -= spread * w_target
                else:
                    g_target -= spread
            if HAS_SOFTCAP:
                g_target *= 1.0 - t_target * t_target
            _store_target_grad(row_grad, t_col, read, g_target)
    if HAS_SMOOTHING:
        loss = hit * (lse - z_target) + smoothing / n_cols_f * (w_total * lse - weighted_z)
    else:
        loss = hit * (lse - z_target)
    if HAS_ZLOSS:
        z_loss = lse_square_scale * lse * lse
        if HAS_WEIGHT and MEAN:
            # The host divides the rows' sum by the counted weights; the z-loss's mean is over the
            # counted rows (Liger-Kernel's convention), so its share is rescaled by their ratio.
            z_loss *= inv_n * tl.load(WEIGHT_STATS + 1)
        loss += z_loss
    tl.store(LOSS + row, tl.where(ignored, 0.0, loss))


@triton.jit
def _options_grad(
    logit, cols, mask, lead, t_col, WEIGHT, lse, softcap, cap_log2, lse_log2, p_scale, hit_scale, spread,
    HAS_WEIGHT, HAS_SMOOTHING, HAS_SOFTCAP, FAST_TANH, TARGET_FIXUP,
):  # fmt: skip
    """Sweep 2's gradient of the logits ``logit`` at aligned columns ``cols`` (``_options_row``), and
    the terms of the smoothing's sum of w_c z_c (z without the softcap's factor)."""
    if HAS_SOFTCAP:
        # exp(z - lse) as 2**(t * softcap * log2(e) - lse * log2(e)): one FMA before the exp2
        t = _tanh(logit.to(tl.float32) * (1.0 / softcap), FAST_TANH)
        g = _exp2(t * cap_log2 - lse_log2) * p_scale
        zs = t  # the softcap's factor goes on once, at the end
    else:
        g = tl.exp(logit.to(tl.float32) - lse) * p_scale
        zs = logit.to(tl.float32)
    if not TARGET_FIXUP:
        g = tl.where(cols == t_col, g - hit_scale, g)
    if HAS_SMOOTHING:
        if HAS_WEIGHT:
            w = tl.load(WEIGHT + (cols - lead), mask=mask, other=0.0).to(tl.float32)
            g -= spread * w
            zs *= w
        else:
            g -= spread
    if HAS_SOFTCAP:
        g *= 1.0 - t * t
    return g, zs


@triton.jit
def _target_stats_kernel(
    TARGET, STATS, n_rows, n_cols, ignore_index, BLOCK: tl.constexpr, WEIGHT=None, WEIGHT_STATS=None
):
    """STATS = (targets that are not ignored, targets out of [0, n_cols) that are not ignored); with
    class weights also WEIGHT_STATS = (sum of the weights, sum of w[target] over counted targets)."""
    n_valid = tl.zeros([BLOCK], dtype=tl.int32)
    n_bad = tl.zeros([BLOCK], dtype=tl.int32)
    if WEIGHT is not None:
        w_target = tl.zeros([BLOCK], dtype=tl.float32)
        w_total = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_rows, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        target = tl.load(TARGET + rows, mask=rows < n_rows, other=ignore_index)
        counted = target != ignore_index
        n_valid += counted.to(tl.int32)
        bad = counted & ((target < 0) | (target >= n_cols))
        n_bad += bad.to(tl.int32)
        if WEIGHT is not None:
            w_target += tl.load(WEIGHT + target, mask=counted & ~bad, other=0.0).to(tl.float32)
    tl.store(STATS, tl.sum(n_valid, axis=0))
    tl.store(STATS + 1, tl.sum(n_bad, axis=0))
    if WEIGHT is not None:
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            w_total += tl.load(WEIGHT + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        tl.store(WEIGHT_STATS, tl.sum(w_total, axis=0))
        tl.store(WEIGHT_STATS + 1, tl.sum(w_target, axis=0))


@triton.jit
def _scale_rows_kernel(GRAD, DLOSS, n_cols, stride_grad, stride_dloss, BLOCK: tl.constexpr):
    """GRAD[row] *= DLOSS[row * stride_dloss], skipped when the factor is exactly 1."""
    row = tl.program_id(0).to(tl.int64)
    factor = tl.load(DLOSS + row * stride_dloss).to(tl.float32)
    if factor != 1.0:
        row_grad = GRAD + row * stride_grad
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            g = tl.load(row_grad + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(row_grad + cols, (g * factor).to(GRAD.dtype.element_ty), mask=mask)


REDUCTIONS = ("mean", "sum", "none")


@dataclass(frozen=True)
class CrossEntropyOptions:
    """The options beyond ``F.cross_entropy``'s defaults; ``None`` (or all defaults) is the plain loss."""

    weight: torch.Tensor | None = None
    label_smoothing: float = 0.0
    softcap: float | None = None
    lse_square_scale: float = 0.0

    @property
    def plain(self) -> bool:
        return (
            self.weight is None
            and self.label_smoothing == 0.0
            and self.softcap is None
            and self.lse_square_scale == 0.0
        )


class CrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        logits,
        target,
        ignore_index,
        reduction,
        inplace,
        check_targets,
        settings: CrossEntropySettings | None = None,
        options: CrossEntropyOptions | None = None,
    ):
        options = options if options is not None and not options.plain else None
        # Settings by row length, and for the softcap on short rows (``settings_for``).
        shape = logits.shape
        rows = as_rows(logits)
        n_rows, n_cols = rows.shape
        settings = settings or settings_for(
            n_cols, rows.element_size(), options.softcap if options is not None else None
        )
        target = target.reshape(-1)
        compute_grad = ctx.needs_input_grad[0]
        if not compute_grad:
            grad = rows  # never written
        elif inplace:
            if rows.data_ptr() != logits.data_ptr() or not logits.is_contiguous():
                raise ValueError("inplace: the logits must be contiguous to receive their gradient in place")
            grad = rows
        else:
            grad = torch.empty((n_rows, n_cols), dtype=logits.dtype, device=logits.device)
        loss_rows = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
        stats = torch.empty(2, dtype=torch.int32, device=logits.device)  # (not ignored, out of range)
        weight = options.weight if options is not None else None
        # (sum of the class weights, sum of the counted targets' weights)
        weight_stats = (
            torch.empty(2, dtype=torch.float32, device=logits.device) if weight is not None else None
        )
        _launch(
            _target_stats_kernel, (1,), (target, stats), (n_rows, n_cols, ignore_index),
            dict(BLOCK=1024, WEIGHT=weight, WEIGHT_STATS=weight_stats),
        )  # fmt: skip
        stats_seen = _stats_to_host(stats) if check_targets else None
        option_args = {}
        if options is not None:
            option_args = dict(
                WEIGHT=weight,
                WEIGHT_STATS=weight_stats,
                smoothing=float(options.label_smoothing),
                softcap=float(options.softcap or 1.0),
                lse_square_scale=float(options.lse_square_scale),
                HAS_WEIGHT=weight is not None,
                HAS_SMOOTHING=options.label_smoothing != 0.0,
                HAS_SOFTCAP=options.softcap is not None,
                HAS_ZLOSS=options.lse_square_scale != 0.0,
                FAST_TANH=fast_tanh(rows.dtype),
                FIXED_MAX=settings.uses_fixed_max(options.softcap),
                TILE_COLS=settings.tile_cols(rows.element_size(), n_cols),
                SWEEP2_SUM=settings.smoothing_in_sweep2(
                    # the logits' rows and the gradient's (n_cols apart)
                    options.softcap,
                    math.gcd(rows.stride(0), n_cols) * rows.element_size(),
                ),
            )
        _launch(
            _cross_entropy_fwd_kernel,
            (persistent_programs(n_rows, settings.programs_per_sm),),
            (rows, target, loss_rows, grad, stats),
            (n_rows, n_cols, rows.stride(0), grad.stride(0), ignore_index),
            dict(
                MEAN=reduction == "mean",
                COMPUTE_GRAD=compute_grad,
                BLOCK_V=settings.block_v(rows.element_size(), n_cols),
                TARGET_FIXUP=settings.target_fixup,
                ALIGN=settings.align(rows, grad),
                **settings.launch_options(),
                **option_args,
            ),
        )
        # The range check waits only for the small stats kernel, and only after the main kernel is
        # queued behind it, so the GPU never idles for it; the main kernel never reads out of bounds
        # (the target's logit is read under a mask, the gradient only compares columns).
        if check_targets and _out_of_range_count(stats_seen):
            _raise_out_of_range(target, ignore_index, n_cols)
        ctx.grad = grad.view(shape) if compute_grad else None
        ctx.reduction = reduction
        # F.cross_entropy's dtype: the logits' own, float32 under autocast (its float32 policy, which
        # upcasts the logits: the same values as reading them in float32 here, without the copy).
        out_dtype = torch.float32 if torch.is_autocast_enabled(logits.device.type) else logits.dtype
        if reduction == "mean":
            ce = loss_rows.sum() / (weight_stats[1] if weight is not None else stats[0])
            return ce.to(out_dtype)
        if reduction == "sum":
            return loss_rows.sum().to(out_dtype)
        return loss_rows.view(shape[:-1]).to(out_dtype)

    @staticmethod
    def backward(ctx, dloss):
        if ctx.grad is None:
            raise RuntimeError(
                "cross_entropy: the gradient stored by the forward was already handed to a first "
                "backward (it is scaled in place); a second backward (retain_graph) is not supported"
            )
        grad, ctx.grad = ctx.grad, None
        rows = grad.view(-1, grad.shape[-1])
        dloss_flat = dloss.reshape(-1) if ctx.reduction == "none" else dloss.reshape(1)
        stride_dloss = dloss_flat.stride(0) if ctx.reduction == "none" else 0
        scale_rows_(rows, dloss_flat, stride_dloss)
        return grad, None, None, None, None, None, None, None


def scale_rows_(rows: torch.Tensor, dloss: torch.Tensor, stride_dloss: int) -> None:
    """``rows[i] *= dloss[i * stride_dloss]`` in place for 2-D ``rows`` with unit column stride
    (``stride_dloss`` 0: one factor for every row), each row skipped on the GPU where its factor is
    exactly 1; the backward of this loss and of the fused linear cross-entropy."""
    launch(
        _LAUNCHES,
        _scale_rows_kernel,
        (rows.shape[0],),
        (rows, dloss),
        (rows.shape[1], rows.stride(0), stride_dloss),
        dict(BLOCK=_SCALE_BLOCK, num_warps=8),
    )


def check_target(target, ignore_index, reduction, rows: torch.Tensor, rows_are: str, lead: str) -> None:
    """``target``, ``ignore_index`` and ``reduction`` as F.cross_entropy takes them, for inputs ``rows``
    of shape (..., C): an int64/int32 target of shape ``rows.shape[:-1]`` on ``rows``' device.
    ``rows_are`` and ``lead`` name the input in the messages (e.g. "x is", "x without the hidden
    dimension"); the fused linear cross-entropy checks its target with this too."""
    if not isinstance(target, torch.Tensor) or target.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"target: expected an int64 or int32 tensor, got {getattr(target, 'dtype', type(target))}"
        )
    if target.shape != rows.shape[:-1]:
        raise ValueError(
            f"target: expected shape {tuple(rows.shape[:-1])} ({lead}), got {tuple(target.shape)}"
        )
    if target.device != rows.device:
        raise ValueError(f"target: on {target.device}, but {rows_are} on {rows.device}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction: expected one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise ValueError(f"ignore_index: expected an int, got {type(ignore_index).__name__}")


def _check(logits, target, ignore_index, reduction, options: CrossEntropyOptions):
    check_tensor("logits", logits)
    if logits.dim() < 2:
        raise ValueError(
            f"logits: expected (..., vocab) with at least 2 dimensions, got {tuple(logits.shape)}"
        )
    check_target(target, ignore_index, reduction, logits, "logits are", "logits without the vocab dimension")
    weight = options.weight
    if weight is not None:
        # F.cross_entropy wants the logits' dtype; float32 is taken too (the kernel reads it in float32).
        check_tensor("weight", weight, dtypes=(logits.dtype, torch.float32), ndim=1)
        if weight.shape[0] != logits.shape[-1]:
            raise ValueError(
                f"weight: expected one weight per class, shape ({logits.shape[-1]},), got {tuple(weight.shape)}"
            )
        if weight.device != logits.device:
            raise ValueError(f"weight: on {weight.device}, but logits are on {logits.device}")
        if weight.stride(0) != 1:
            raise ValueError("weight: expected a contiguous tensor")
        if weight.requires_grad:
            raise ValueError(
                "weight: class weights get no gradient (as in F.cross_entropy); pass weight.detach()"
            )
    smoothing = options.label_smoothing
    if not isinstance(smoothing, int | float) or not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"label_smoothing: expected a number in [0, 1], got {smoothing!r}")
    cap = options.softcap
    if cap is not None and (not isinstance(cap, int | float) or not 0.0 < cap < math.inf):
        raise ValueError(f"softcap: expected None or a finite number > 0, got {cap!r}")
    scale = options.lse_square_scale
    if not isinstance(scale, int | float) or not 0.0 <= scale < math.inf:
        raise ValueError(f"lse_square_scale: expected a finite number >= 0, got {scale!r}")


def _stats_to_host(stats: torch.Tensor):
    """Start copying the counts to the host; returns what ``_out_of_range_count`` waits on. While a
    CUDA graph captures, nothing may come back to the host: the check is then a device-side
    assertion, as F.cross_entropy's own on CUDA (an out-of-range target in a replay stops the
    process with a device assert, never a wrong loss), and there is nothing to wait on (None)."""
    if INTERPRET:
        return stats
    if torch.cuda.is_current_stream_capturing():
        torch._assert_async(
            stats[1] == 0, "cross_entropy: a target is outside [0, vocab) and not ignore_index"
        )
        return None
    # A page-locked landing buffer of the call's own, from PyTorch's caching host allocator (a reused
    # block after the first call): no buffer shared between calls on different streams or threads.
    pinned = torch.empty(2, dtype=torch.int32, pin_memory=True)
    pinned.copy_(stats, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()
    return pinned, copied


def _out_of_range_count(stats_seen) -> int:
    if stats_seen is None:  # checked on the device (graph capture)
        return 0
    if INTERPRET:
        return int(stats_seen[1])
    pinned, copied = stats_seen
    copied.synchronize()  # the stats kernel and the copy: not the main kernel queued after them
    return int(pinned[1])


def _raise_out_of_range(target, ignore_index, vocab):
    bad = (target != ignore_index) & ((target < 0) | (target >= vocab))
    raise ValueError(
        f"target: value {int(target[bad][0])} is outside [0, {vocab}) and is not ignore_index={ignore_index}"
    )


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    softcap: float | None = None,
    lse_square_scale: float = 0.0,
    *,
    inplace: bool = False,
    check_targets: bool = True,
) -> torch.Tensor:
    """Cross-entropy of ``logits`` (..., V) against ``target`` (...), like ``F.cross_entropy``.

    The loss has the logits' dtype (float32 under ``torch.autocast``, F.cross_entropy's policy); it is
    accumulated in float32. ``weight`` (V,), ``ignore_index``, ``reduction`` and ``label_smoothing``
    mean what they mean in ``F.cross_entropy`` (the mean divides by the summed weights of the
    counted targets). Beyond it:

    - ``softcap``: the logits become ``softcap * tanh(logits / softcap)`` before the softmax (Gemma 2);
    - ``lse_square_scale``: adds ``lse_square_scale * logsumexp(z)**2`` to each counted token's loss
      (z-loss, PaLM); with ``reduction="mean"`` that term is averaged over the counted tokens
      (unweighted, as Liger-Kernel does).

    With ``inplace=True`` the gradient is written over the logits (saving their size in memory); the
    caller's logits are then gone, so use it only when nothing else needs them. A second backward
    through the same graph (``retain_graph=True``) is refused. The forward computes the gradient and
    stores it in the logits' dtype; the backward scales it by the upstream gradient. An upstream of
    1 (``loss.backward()``) or a power of two scales exactly; any other value rounds a 16-bit
    gradient a second time (F.cross_entropy rounds once): up to 2 x 2**-8 relative in bf16.

    A target outside [0, V) that is not ``ignore_index`` raises ``ValueError``. Finding out reads a
    count from the device: one wait per call for a small kernel queued before the main one (the GPU
    never idles for it); ``check_targets=False`` skips it for callers that validate targets upstream:
    such a row's loss and gradient are then NaN. Inside a CUDA graph capture the check is a
    device-side assertion instead (as F.cross_entropy's on CUDA), so a captured training step
    (``tritonlab.graphs.GraphedStep``) keeps it. All other checks read no device memory.
    """
    options = CrossEntropyOptions(weight, label_smoothing, softcap, lse_square_scale)
    _check(logits, target, ignore_index, reduction, options)
    return CrossEntropyFunction.apply(
        logits, target, ignore_index, reduction, inplace, check_targets, None, options
    )


class CrossEntropyLoss(torch.nn.Module):
    """``torch.nn.CrossEntropyLoss`` on the Triton kernels, with :func:`cross_entropy`'s options
    (``weight`` is a buffer, so it follows the module's ``.to()``)."""

    def __init__(
        self,
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        softcap: float | None = None,
        lse_square_scale: float = 0.0,
    ):
        super().__init__()
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.softcap = softcap
        self.lse_square_scale = lse_square_scale

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return cross_entropy(
            logits,
            target,
            self.weight,
            self.ignore_index,
            self.reduction,
            self.label_smoothing,
            self.softcap,
            self.lse_square_scale,
        )


__all__ = ["CrossEntropyLoss", "cross_entropy"]
