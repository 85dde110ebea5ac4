"""Fused linear cross-entropy: the loss of ``x @ weight.T (+ bias)`` without the full logits.

For N tokens x (N, H), a vocabulary weight W (V, H), an optional bias b (V,) and targets t (N,):

    z = x W^T + b                       (N, V) logits
    loss_i = CE(z_i, t_i)               our cross-entropy kernel, options included
    G = dloss/dz                        (N, V): (softmax(z) - onehot(t)) * scale, per row
    dx = G W      dW = G^T x      db = sum_i G_i

**Memory.** Eager PyTorch materialises z (N x V), upcasts it to float32, keeps a log-softmax for
the backward and writes G: at N = 16 384, V = 128 256 that is 8.4 GB of float32 logits alone
(+22 GiB measured in all). Here the tokens are cut into chunks of ``chunk_rows`` rows; for each chunk

1. ``z_c = x_c W^T (+ b)`` into one reused (chunk_rows, V) buffer, by cuBLAS (``torch.mm``: the
   matmuls are where the time is, ~3 GEMMs of 2 N H V flops each);
2. our cross-entropy kernel reads z_c once, writes loss_c and overwrites z_c with G_c **in place**;
3. ``dx_c = G_c W`` and ``dW += G_c^T x_c`` (``db += sum G_c``) -- the whole gradient, in the forward.

What stays alive is the chunk buffer (``chunk_rows x V``, bounded by ``DEFAULT_CHUNK_BYTES``: 512 MiB
on a GPU, 8 KiB in the interpreter, so tests see many chunks), dx (N x H) and dW (V x H): at
(16 384, 4 096, 128 256) in bf16, 0.5 + 0.125 + 0.98 GiB. The backward only multiplies the stored
gradients by the upstream gradient (a scalar for ``mean`` and ``sum``), in place, and skips that pass
when the scalar is 1 (``loss.backward()``): the kernel reads it on the GPU, so the host never waits
for it (a CUDA graph can capture the step), and 2 GiB of dW traffic is saved.

**The mean** divides by the counted (non-ignored) targets of the *whole* batch: a small kernel counts
them (and the targets out of range, which raise ``ValueError``) before the first chunk, and every
chunk's kernel reads that count.

**dW's dtype.** dW is accumulated in the weight's dtype with ``addmm_`` (beta = 1): cuBLAS sums each
chunk's product in float32 and adds the running sum before rounding, so a bf16 dW is rounded once
per chunk (a handful of roundings at the default chunk size, each 2**-9 relative) rather than once in
all. A float32 accumulator would be exact to float32 but costs 4 V H bytes -- 2 GiB at V = 128 256,
H = 4 096, more than the whole rest of the working set -- which is what this kernel exists to avoid.
The bias gradient is tiny and is accumulated in float32.

**reduction="none".** Per-token upstream gradients g_i cannot be applied after the fact to dW = sum_i
g_i G_i^T x_i, so with ``"none"`` the forward computes only the per-token losses (no gradient) and
the backward runs the chunk loop again with each row of G scaled by g_i: one extra GEMM (the logits
are recomputed), the same memory bound.

**torch.compile.** The forward (and the ``"none"`` backward) are ``torch.library.custom_op``\\s with
fake implementations and a registered autograd formula, so ``torch.compile(fullgraph=True)`` over
code that calls :func:`fused_linear_cross_entropy` traces through them as opaque nodes.

Not handled: ``torch.autocast`` does not cast x and W here (the matmul runs in their own, equal,
dtype; the loss is float32 under autocast, as F.cross_entropy's is); class ``weight`` and z-loss of
:func:`cross_entropy` are not offered.
"""

import math

import torch

from .._launch import LaunchCache, first_launch, launch
from .._runtime import INTERPRET
from ..checks import check_same, check_tensor, persistent_programs
from .cross_entropy import (
    _cross_entropy_fwd_kernel,
    _out_of_range_count,
    _raise_out_of_range,
    _stats_to_host,
    _target_stats_kernel,
    check_target,
    fast_tanh,
    scale_rows_,
    settings_for,
)

# Bytes of one chunk's logits: large enough that each chunk's GEMMs run at full speed on an H100
# (2 048 rows of a 128 256 bf16 vocabulary), small enough to bound memory; tiny in the interpreter.
DEFAULT_CHUNK_BYTES = 2048 * 4 if INTERPRET else 512 * 2**20
# On a GPU, chunks are a multiple of this many rows (whole GEMM tiles) when they can be.
_ROW_MULTIPLE = 1 if INTERPRET else 128
# The cross-entropy's kernels per call signature, launched directly after its first call
# (tritonlab._launch); no tensor is among their keyword arguments here (no class weights).
_LAUNCHES = LaunchCache(first_launch)


def chunk_rows_for(n_rows: int, vocab: int, element_size: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Rows per chunk: at most ``chunk_bytes`` of logits, chunks of equal size (the last one no
    smaller than needed), a multiple of 128 rows on a GPU where the budget allows."""
    most = max(1, chunk_bytes // (vocab * element_size))
    if most >= 2 * _ROW_MULTIPLE:
        most -= most % _ROW_MULTIPLE
    n_chunks = max(1, math.ceil(n_rows / most))
    rows = math.ceil(n_rows / n_chunks)
    if _ROW_MULTIPLE > 1 and most % _ROW_MULTIPLE == 0:
        rows = min(most, math.ceil(rows / _ROW_MULTIPLE) * _ROW_MULTIPLE)
    return max(1, rows)


def _chunked_pass(
    x, weight, target, bias, ignore_index, mean, label_smoothing, softcap, chunk_rows,
    grad_x, grad_weight, grad_bias, row_scale=None, check_targets=True,
):  # fmt: skip
    """The chunk loop. Returns (loss per row in float32, counted targets (int32 tensor), dx, dW, db);
    a gradient not asked for is None. ``row_scale`` (N,) multiplies each row of G (reduction none)."""
    n_rows, _ = x.shape
    vocab = weight.shape[0]
    device = x.device
    compute_grad = grad_x or grad_weight or grad_bias
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=device)
    stats = torch.empty(2, dtype=torch.int32, device=device)  # (not ignored, out of range)
    launch(
        _LAUNCHES,
        _target_stats_kernel,
        (1,),
        (target, stats),
        (n_rows, vocab, ignore_index),
        dict(BLOCK=1024),
    )
    stats_seen = _stats_to_host(stats) if check_targets else None

    settings = settings_for(vocab, x.element_size(), softcap)
    option_args = {}
    if label_smoothing != 0.0 or softcap is not None:
        option_args = dict(
            smoothing=float(label_smoothing),
            softcap=float(softcap or 1.0),
            HAS_SMOOTHING=label_smoothing != 0.0,
            HAS_SOFTCAP=softcap is not None,
            FAST_TANH=fast_tanh(x.dtype),
            FIXED_MAX=settings.uses_fixed_max(softcap),
            TILE_COLS=settings.tile_cols(x.element_size(), vocab),
            SWEEP2_SUM=settings.smoothing_in_sweep2(softcap, vocab * x.element_size()),
        )
    block_v = settings.block_v(x.element_size(), vocab)

    rows_per_chunk = min(chunk_rows, max(n_rows, 1))
    buf = torch.empty((rows_per_chunk, vocab), dtype=x.dtype, device=device)
    dx = torch.empty_like(x) if grad_x else None
    dw = torch.zeros_like(weight) if grad_weight and n_rows == 0 else None
    db = torch.zeros(vocab, dtype=torch.float32, device=device) if grad_bias else None
    w_t = weight.t()
    for start in range(0, n_rows, rows_per_chunk):
        stop = min(n_rows, start + rows_per_chunk)
        x_c = x[start:stop]
        z = buf[: stop - start]
        if bias is not None:
            torch.addmm(bias, x_c, w_t, out=z)
        else:
            torch.mm(x_c, w_t, out=z)
        # cross_entropy's own kernel over this chunk's logits (a launch like rms_norm's only in shape).
        launch(
            _LAUNCHES,
            _cross_entropy_fwd_kernel,
            (persistent_programs(stop - start, settings.programs_per_sm),),
            # the gradient overwrites the logits it is computed from, row by row
            (z, target[start:stop], loss_rows[start:stop], z, stats),
            (stop - start, vocab, z.stride(0), z.stride(0), ignore_index),
            dict(
                MEAN=mean,
                COMPUTE_GRAD=compute_grad,
                BLOCK_V=block_v,
                ALIGN=settings.align(z, z),
                **settings.launch_options(),
                **option_args,
            ),
        )
        if start == 0 and check_targets and _out_of_range_count(stats_seen):
            # Waited for only now, with the first chunk queued behind the count.
            _raise_out_of_range(target, ignore_index, vocab)
        if not compute_grad:
            continue
        if row_scale is not None:
            z.mul_(row_scale[start:stop, None])
        if grad_x:
            torch.mm(z, weight, out=dx[start:stop])
        if grad_weight:
            if dw is None:
                dw = torch.mm(z.t(), x_c)
            else:
                dw.addmm_(z.t(), x_c)
        if grad_bias:
            db.add_(z.sum(0, dtype=torch.float32))
    return loss_rows, stats, dx, dw, db


@torch.library.custom_op("tritonlab::scale_unless_one_", mutates_args=("t",))
def _scale_unless_one_(t: torch.Tensor, g: torch.Tensor) -> None:
    """``t.mul_(g)`` for a one-element ``g``: cross_entropy's row scaling, which skips every row on
    the GPU when g is 1; torch's multiply where ``t`` is not contiguous."""
    if not t.is_contiguous() or t.numel() == 0:
        t.mul_(g)
        return
    scale_rows_(t.view(-1, t.shape[-1]), g.reshape(1), 0)


@_scale_unless_one_.register_fake
def _(t, g):
    return None


_EMPTY = (0,)


def _grad_outputs(x, bias, dx, dw, db):
    """(dx, dW, db) as the custom ops return them: an empty tensor where not computed (each its own,
    as outputs must not alias), db in the bias's dtype."""
    empty = x.new_empty(_EMPTY)
    return (
        dx if dx is not None else empty,
        dw if dw is not None else empty.clone(),
        db.to(bias.dtype) if db is not None else empty.clone(),
    )


def _fake_grad_outputs(x, weight, bias, grad_x, grad_weight, grad_bias):
    """``_grad_outputs``' shapes for the fake (meta) implementations."""
    return (
        torch.empty_like(x) if grad_x else x.new_empty(_EMPTY),
        torch.empty_like(weight) if grad_weight else x.new_empty(_EMPTY),
        torch.empty_like(bias) if grad_bias else x.new_empty(_EMPTY),
    )


@torch.library.custom_op("tritonlab::fused_linear_cross_entropy", mutates_args=())
def _flce_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    softcap: float | None,
    chunk_rows: int,
    grad_x: bool,
    grad_weight: bool,
    grad_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss in float32: () for mean/sum, (N,) for none; dx; dW; db), the gradients of the summed or
    averaged loss (empty where not asked for, and always empty for ``"none"``)."""
    if reduction == "none":
        grad_x = grad_weight = grad_bias = False
    loss_rows, stats, dx, dw, db = _chunked_pass(
        x, weight, target, bias, ignore_index, reduction == "mean", label_smoothing, softcap, chunk_rows,
        grad_x, grad_weight, grad_bias,
    )  # fmt: skip
    if reduction == "mean":
        loss = loss_rows.sum() / stats[0]
    elif reduction == "sum":
        loss = loss_rows.sum()
    else:
        loss = loss_rows
    return (loss, *_grad_outputs(x, bias, dx, dw, db))


@_flce_forward.register_fake
def _(x, weight, target, bias, ignore_index, reduction, label_smoothing, softcap, chunk_rows,
      grad_x, grad_weight, grad_bias):  # fmt: skip
    if reduction == "none":
        return (
            x.new_empty(x.shape[0], dtype=torch.float32),
            x.new_empty(_EMPTY),
            x.new_empty(_EMPTY),
            x.new_empty(_EMPTY),
        )
    return (
        x.new_empty((), dtype=torch.float32),
        *_fake_grad_outputs(x, weight, bias, grad_x, grad_weight, grad_bias),
    )


# The forward op's arguments typed out again: torch.library reads each op's schema from its own annotations.
@torch.library.custom_op("tritonlab::fused_linear_cross_entropy_backward_none", mutates_args=())
def _flce_backward_none(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    grad_rows: torch.Tensor,
    ignore_index: int,
    label_smoothing: float,
    softcap: float | None,
    chunk_rows: int,
    grad_x: bool,
    grad_weight: bool,
    grad_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """reduction="none": the chunk loop again, each row of G times its upstream gradient."""
    _, _, dx, dw, db = _chunked_pass(
        x, weight, target, bias, ignore_index, False, label_smoothing, softcap, chunk_rows,
        grad_x, grad_weight, grad_bias, row_scale=grad_rows.to(torch.float32).contiguous(),
        check_targets=False,
    )  # fmt: skip
    return _grad_outputs(x, bias, dx, dw, db)


@_flce_backward_none.register_fake
def _(x, weight, target, bias, grad_rows, ignore_index, label_smoothing, softcap, chunk_rows,
      grad_x, grad_weight, grad_bias):  # fmt: skip
    return _fake_grad_outputs(x, weight, bias, grad_x, grad_weight, grad_bias)


def _setup_context(ctx, inputs, output):
    x, weight, target, bias, ignore_index, reduction, smoothing, softcap, chunk_rows, gx, gw, gb = inputs
    _, dx, dw, db = output
    ctx.mark_non_differentiable(dx, dw, db)
    ctx.set_materialize_grads(False)  # no zero-filled dW-sized gradients for the outputs above
    ctx.reduction = reduction
    ctx.flags = (gx, gw, gb)
    ctx.args = (ignore_index, smoothing, softcap, chunk_rows)
    if reduction == "none":
        ctx.save_for_backward(x, weight, target, bias)
    else:
        # A plain attribute, not save_for_backward: handed to the caller in the backward with no
        # other reference left, autograd moves them into .grad instead of copying dW (1 GiB).
        ctx.grads = (dx, dw, db)


def _backward(ctx, grad_loss, _grad_dx, _grad_dw, _grad_db):
    gx, gw, gb = ctx.flags
    if grad_loss is None:
        return (None,) * 12
    if ctx.reduction == "none":
        x, weight, target, bias = ctx.saved_tensors
        ignore_index, smoothing, softcap, chunk_rows = ctx.args
        dx, dw, db = _flce_backward_none(
            x, weight, target, bias, grad_loss, ignore_index, smoothing, softcap, chunk_rows, gx, gw, gb
        )
    else:
        if ctx.grads is None:
            raise RuntimeError(
                "fused_linear_cross_entropy: the gradients stored by the forward were already handed "
                "to a first backward (scaled in place); a second backward (retain_graph) is not supported"
            )
        (dx, dw, db), ctx.grads = ctx.grads, None
        # In place: a second dW-sized buffer here would double the peak. (Under torch.compile the
        # graph is functionalised and the compiler decides.)
        for g, flag in zip((dx, dw, db), (gx, gw, gb), strict=True):
            if flag:
                _scale_unless_one_(g, grad_loss)
    return (
        dx if gx else None,
        dw if gw else None,
        None,
        db if gb else None,
        *(None,) * 8,
    )


_flce_forward.register_autograd(_backward, setup_context=_setup_context)


def _check(x, weight, target, bias, ignore_index, reduction, label_smoothing, softcap, chunk_rows):
    check_tensor("x", x)
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"x: expected (..., hidden) with hidden >= 1, got shape {tuple(x.shape)}")
    check_tensor("weight", weight, ndim=2)
    check_same("weight", weight, "x", x, shape=False)
    if weight.shape[1] != x.shape[-1]:
        raise ValueError(
            f"weight: expected (vocab, {x.shape[-1]}) to match x's width {x.shape[-1]}, "
            f"got {tuple(weight.shape)}"
        )
    if weight.shape[0] < 1:
        raise ValueError("weight: expected at least one class (row)")
    if bias is not None:
        check_tensor("bias", bias, ndim=1)
        check_same("bias", bias, "weight", weight, shape=False)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias: expected shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    check_target(target, ignore_index, reduction, x, "x is", "x without the hidden dimension")
    if (
        isinstance(label_smoothing, bool)
        or not isinstance(label_smoothing, int | float)
        or not 0.0 <= label_smoothing <= 1.0
    ):
        raise ValueError(f"label_smoothing: expected a number in [0, 1], got {label_smoothing!r}")
    if softcap is not None and (
        isinstance(softcap, bool) or not isinstance(softcap, int | float) or not 0.0 < softcap < math.inf
    ):
        raise ValueError(f"softcap: expected None or a finite number > 0, got {softcap!r}")
    if chunk_rows is not None and (
        isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1
    ):
        raise ValueError(f"chunk_rows: expected None or an int >= 1, got {chunk_rows!r}")


# Options named and ordered as cross_entropy's (and torch's F.cross_entropy): one vocabulary to learn.
def fused_linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    softcap: float | None = None,
    *,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """``F.cross_entropy(F.linear(x, weight, bias), target, ...)`` without the (..., V) logits.

    ``x`` (..., H), ``weight`` (V, H) and ``bias`` (V,) share one float dtype and device; ``target``
    (...) is int64 or int32. ``ignore_index``, ``reduction`` and ``label_smoothing`` mean what they
    mean in ``F.cross_entropy``; ``softcap`` applies ``softcap * tanh(z / softcap)`` to the logits
    first (Gemma 2). The loss has x's dtype (float32 under autocast); it is accumulated in float32.

    ``chunk_rows`` overrides the tokens per chunk (default: ``DEFAULT_CHUNK_BYTES`` of logits). The
    gradients are computed in the forward when any of x, weight, bias requires one (see the module
    docstring; a second backward through the same graph is refused). A target outside [0, V) that
    is not ``ignore_index`` raises ``ValueError``.
    """
    _check(x, weight, target, bias, ignore_index, reduction, label_smoothing, softcap, chunk_rows)
    hidden = x.shape[-1]
    x2d = x.reshape(-1, hidden)
    target1d = target.reshape(-1).contiguous()
    if chunk_rows is None:
        chunk_rows = chunk_rows_for(x2d.shape[0], weight.shape[0], x.element_size())
    grad_on = torch.is_grad_enabled()
    loss, _, _, _ = _flce_forward(
        x2d,
        weight,
        target1d,
        bias,
        ignore_index,
        reduction,
        float(label_smoothing),
        None if softcap is None else float(softcap),
        chunk_rows,
        grad_on and x.requires_grad,
        grad_on and weight.requires_grad,
        grad_on and bias is not None and bias.requires_grad,
    )
    out_dtype = torch.float32 if torch.is_autocast_enabled(x.device.type) else x.dtype
    if reduction == "none":
        loss = loss.view(x.shape[:-1])
    return loss.to(out_dtype)


class FusedLinearCrossEntropyLoss(torch.nn.Module):
    """The loss of a language-model head: ``forward(x, weight, target, bias=None)`` is
    :func:`fused_linear_cross_entropy` with this module's options."""

    def __init__(
        self,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        softcap: float | None = None,
        chunk_rows: int | None = None,
    ):
        super().__init__()
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.softcap = softcap
        self.chunk_rows = chunk_rows

    def forward(
        self, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return fused_linear_cross_entropy(
            x,
            weight,
            target,
            bias,
            self.ignore_index,
            self.reduction,
            self.label_smoothing,
            self.softcap,
            chunk_rows=self.chunk_rows,
        )


__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "FusedLinearCrossEntropyLoss",
    "chunk_rows_for",
    "fused_linear_cross_entropy",
]
