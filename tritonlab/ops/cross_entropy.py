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

Launch settings (:class:`CrossEntropySettings`, swept by ``python -m phases kernel_suite --tune``):
each sweep-1 iteration moves ``block_bytes`` of logits -- 64 KB measured fastest at 16384 x 128256
bf16 on the H100 (3.60 ms against 3.95 ms at 32 KB: more bytes in flight per SM), so the block's
*element* count follows the element size (32 768 bf16 logits, 16 384 float32 ones: the same bytes
and registers per thread). The interpreter runs small blocks faster.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .._runtime import INTERPRET
from ..checks import as_rows, check_tensor, persistent_programs


@dataclass(frozen=True)
class CrossEntropySettings:
    """``block_bytes``: logits per sweep-1 iteration, in bytes; ``num_warps``; ``programs_per_sm``:
    rows in flight per SM (their logits must stay in L2 for sweep 2: 0.5 per SM measured 6.28 ms,
    1 per SM 3.60 ms)."""

    block_bytes: int = 2048 if INTERPRET else 65536
    num_warps: int = 32
    programs_per_sm: float = 1.0

    def block_v(self, element_size: int) -> int:
        return triton.next_power_of_2(max(16, self.block_bytes // element_size))


DEFAULT_SETTINGS = CrossEntropySettings()
_SCALE_BLOCK = 512 if INTERPRET else 4096


@triton.jit
def _row_logsumexp(row_logits, n_cols, BLOCK_V: tl.constexpr):
    """Running max and sum per block: the max only grows, the sum is rescaled with it. Each block's
    load is issued one iteration ahead, so its latency overlaps the reductions (and their barriers)
    of the block before; the last prefetch is fully masked."""
    running_max = float("-inf")
    running_sum = 0.0
    cols = tl.arange(0, BLOCK_V)
    x = tl.load(row_logits + cols, mask=cols < n_cols, other=float("-inf"), eviction_policy="evict_last")
    for start in range(BLOCK_V, n_cols + BLOCK_V, BLOCK_V):
        next_cols = start + tl.arange(0, BLOCK_V)
        x_next = tl.load(
            row_logits + next_cols, mask=next_cols < n_cols, other=float("-inf"), eviction_policy="evict_last"
        )
        xf = x.to(tl.float32)
        new_max = tl.maximum(running_max, tl.max(xf, axis=0))
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(xf - new_max), axis=0)
        running_max = new_max
        x = x_next
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
):
    inv_n = 1.0 / tl.load(N_VALID).to(tl.float32) if MEAN else 1.0
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row_logits = LOGITS + tl.cast(row, tl.int64) * stride_logits
        target = tl.load(TARGET + row).to(tl.int64)
        ignored = target == ignore_index
        # Sweep 1: online logsumexp.
        lse = _row_logsumexp(row_logits, n_cols, BLOCK_V)
        # A target out of range is never read; its row's loss and gradient become NaN, and the
        # host raises unless the caller turned the check off.
        bad = ~ignored & ((target < 0) | (target >= n_cols))
        x_target = tl.load(row_logits + target, mask=~ignored & ~bad, other=float("nan")).to(tl.float32)
        tl.store(LOSS + row, tl.where(ignored, 0.0, lse - x_target))
        if COMPUTE_GRAD:
            scale = tl.where(ignored, 0.0, tl.where(bad, float("nan"), inv_n))
            row_grad = GRAD + tl.cast(row, tl.int64) * stride_grad
            # Sweep 2: the row is still in L2; write the gradient once.
            for start in range(0, n_cols, BLOCK_V):
                cols = start + tl.arange(0, BLOCK_V)
                mask = cols < n_cols
                # (a new name: reusing sweep 1's `x` would make it a loop-carried variable of another type)
                logit = tl.load(row_logits + cols, mask=mask, other=0.0, eviction_policy="evict_first")
                p = tl.exp(logit.to(tl.float32) - lse)
                g = tl.where(cols == target, p - 1.0, p) * scale
                tl.store(
                    row_grad + cols, g.to(GRAD.dtype.element_ty), mask=mask, eviction_policy="evict_first"
                )


@triton.jit
def _target_stats_kernel(TARGET, STATS, n_rows, n_cols, ignore_index, BLOCK: tl.constexpr):
    """STATS = (targets that are not ignored, targets out of [0, n_cols) that are not ignored)."""
    n_valid = tl.zeros([BLOCK], dtype=tl.int32)
    n_bad = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, n_rows, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        target = tl.load(TARGET + rows, mask=rows < n_rows, other=ignore_index)
        counted = target != ignore_index
        n_valid += counted.to(tl.int32)
        n_bad += (counted & ((target < 0) | (target >= n_cols))).to(tl.int32)
    tl.store(STATS, tl.sum(n_valid, axis=0))
    tl.store(STATS + 1, tl.sum(n_bad, axis=0))


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


class CrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, logits, target, ignore_index, reduction, inplace, check_targets, settings=DEFAULT_SETTINGS
    ):
        shape = logits.shape
        rows = as_rows(logits)
        n_rows, n_cols = rows.shape
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
        _target_stats_kernel[(1,)](target, stats, n_rows, n_cols, ignore_index, BLOCK=1024)
        stats_seen = _stats_to_host(stats) if check_targets else None
        _cross_entropy_fwd_kernel[(persistent_programs(n_rows, settings.programs_per_sm),)](
            rows,
            target,
            loss_rows,
            grad,
            stats,
            n_rows,
            n_cols,
            rows.stride(0),
            grad.stride(0),
            ignore_index,
            MEAN=reduction == "mean",
            COMPUTE_GRAD=compute_grad,
            BLOCK_V=settings.block_v(rows.element_size()),
            num_warps=settings.num_warps,
        )
        # The range check waits only for the small stats kernel, and only after the main kernel is
        # queued behind it, so the GPU never idles for it; the main kernel never reads out of bounds
        # (the target's logit is read under a mask, the gradient only compares columns).
        if check_targets and _out_of_range_count(stats_seen):
            _raise_out_of_range(target, ignore_index, n_cols)
        ctx.grad = grad.view(shape) if compute_grad else None
        ctx.reduction = reduction
        if reduction == "mean":
            return loss_rows.sum() / stats[0]
        if reduction == "sum":
            return loss_rows.sum()
        return loss_rows.view(shape[:-1])

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
        _scale_rows_kernel[(rows.shape[0],)](
            rows,
            dloss_flat,
            rows.shape[1],
            rows.stride(0),
            stride_dloss,
            BLOCK=_SCALE_BLOCK,
            num_warps=8,
        )
        return grad, None, None, None, None, None, None


def _check(logits, target, ignore_index, reduction):
    check_tensor("logits", logits)
    if logits.dim() < 2:
        raise ValueError(
            f"logits: expected (..., vocab) with at least 2 dimensions, got {tuple(logits.shape)}"
        )
    if not isinstance(target, torch.Tensor) or target.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"target: expected an int64 or int32 tensor, got {getattr(target, 'dtype', type(target))}"
        )
    if target.shape != logits.shape[:-1]:
        raise ValueError(
            f"target: expected shape {tuple(logits.shape[:-1])} (logits without the vocab dimension), "
            f"got {tuple(target.shape)}"
        )
    if target.device != logits.device:
        raise ValueError(f"target: on {target.device}, but logits are on {logits.device}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction: expected one of {', '.join(REDUCTIONS)}, got {reduction!r}")


# Per device, a page-locked landing buffer for the two counts; each call reads it before returning,
# so calls in sequence share it (calls on several streams at once would each need their own).
_PINNED_STATS: dict = {}


def _stats_to_host(stats: torch.Tensor):
    """Start copying the counts to the host; returns what ``_out_of_range_count`` waits on."""
    if INTERPRET:
        return stats
    pinned = _PINNED_STATS.get(stats.device)
    if pinned is None:
        pinned = _PINNED_STATS[stats.device] = torch.empty(2, dtype=torch.int32, pin_memory=True)
    pinned.copy_(stats, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()
    return pinned, copied


def _out_of_range_count(stats_seen) -> int:
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
    ignore_index: int = -100,
    reduction: str = "mean",
    inplace: bool = False,
    check_targets: bool = True,
) -> torch.Tensor:
    """Cross-entropy of ``logits`` (..., V) against ``target`` (...), like ``F.cross_entropy``.

    The loss is fp32. With ``inplace=True`` the gradient is written over the logits (saving their
    size in memory); the caller's logits are then gone, so use it only when nothing else needs them.
    A second backward through the same graph (``retain_graph=True``) is refused.

    A target outside [0, V) that is not ``ignore_index`` raises ``ValueError``. Finding out waits
    for the GPU (one sync per call, after all the work is queued); ``check_targets=False`` skips
    it for callers that validate targets upstream: such a row's loss and gradient are then NaN.
    """
    _check(logits, target, ignore_index, reduction)
    return CrossEntropyFunction.apply(logits, target, ignore_index, reduction, inplace, check_targets)


class CrossEntropyLoss(torch.nn.Module):
    def __init__(self, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__()
        self.ignore_index = ignore_index
        self.reduction = reduction

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return cross_entropy(logits, target, self.ignore_index, self.reduction)


__all__ = ["CrossEntropyLoss", "cross_entropy"]
