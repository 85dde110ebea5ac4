"""The mixture negative log-likelihood in one kernel forward and one kernel backward.

For each target t the head predicts K Gaussians: a logit w_k, a mean mu_k and a log-scale s_k.
With pi = softmax(w), z_k = (y - mu_k)·exp(-s_k) and a_k = log pi_k - z_k²/2 - s_k - log √(2π),

    loss = -(1/T) Σ_t logsumexp_k a_k.

The forward reads params (T, K, 3) and y once and writes one scalar; the backward reads them
again and writes only dparams (T, K, 3): with the responsibilities r = softmax(a),

    dw_k = -(r_k - pi_k)/T,   dmu_k = -r_k z_k exp(-s_k)/T,   ds_k = -r_k (z_k² - 1)/T.

**Layout.** The loss is memory-bound only if a row costs few instructions, so each thread owns
whole rows: a row's K·3 values are contiguous, and a program loads its rows as one
(rows, WIDTH) tile, WIDTH = K·3 rounded up to a power of two (32 for K = 10). A warp then reads
whole rows in vectors of two values, and the columns past K·3 are masked, so no memory lanes go
to padding. Halving the columns log2(WIDTH) times with ``tl.split`` hands each thread its rows'
columns as separate (rows,) vectors (Triton routes the tile through shared memory to do so);
from there every per-row reduction over the K components is a chain of adds and maxima inside
one thread, with no shuffles and no padded components. The backward joins its columns back the
same way and stores whole rows. About 420 instructions a row forward and 630 backward (sm_90
SASS), against ~800 for the padded (rows, 16, 4) tiles this replaced.

Everything is fp32 in registers, and the exponentials are taken in base 2 (``exp2`` is one
hardware instruction; ``exp`` adds a multiply and a denormal fix-up). Is it finite at the spec's
extremes, |y - mu| = 1e4 and s = -20? z = 1e4·e^20 ≈ 4.9e12, z² ≈ 2.4e25 and z·exp(-s) ≈ 2.4e21:
far below fp32's 3.4e38, so no clamp is needed (bf16 has fp32's range too; fp16 gradients would
overflow at 65 504, so fp16 params are rejected).

**torch.compile.** Dynamo cannot trace the launches (direct launches of cached binaries), so while
it traces, ``gmm_nll`` calls the custom op ``tritonlab::gmm_nll_forward`` (a float32 scalar; its
fake implementation says so), whose registered autograd formula calls
``tritonlab::gmm_nll_backward``: the same launches as the eager route, as opaque nodes. Eager
calls keep the plain autograd function, which skips the custom-op dispatcher's host time.
"""

import math

import torch
import triton
import triton.language as tl
from torch import Tensor, nn

from ._launch import LaunchCache, first_launch, launch
from ._runtime import cdiv, sm_count
from .checks import check_offset_range, check_tensor

__all__ = ["GMMNLLLoss", "gmm_nll"]

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_LOG2E = math.log2(math.e)
_LN2 = math.log(2.0)
_SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)


@triton.jit
def _split_columns(tile, LOG2_WIDTH: tl.constexpr):
    """The columns of a (rows, 2**LOG2_WIDTH) tile as a tuple of (rows,) vectors, in column order.

    Each round splits every piece into its even and odd columns; listing all the evens before all
    the odds keeps piece i holding the columns ≡ i modulo the number of pieces.
    """
    pieces = (tile,)
    for _ in tl.static_range(LOG2_WIDTH):
        evens = ()
        odds = ()
        for i in tl.static_range(len(pieces)):
            piece = pieces[i]
            even, odd = tl.split(tl.reshape(piece, (piece.shape[0], piece.shape[1] // 2, 2)))
            evens = evens + (even,)
            odds = odds + (odd,)
        pieces = evens + odds
    columns = ()
    for i in tl.static_range(len(pieces)):
        columns = columns + (tl.reshape(pieces[i], (pieces[i].shape[0],)),)
    return columns


@triton.jit
def _join_columns(columns, LOG2_WIDTH: tl.constexpr):
    """The inverse of ``_split_columns``: a tuple of 2**LOG2_WIDTH (rows,) vectors as one tile."""
    pieces = ()
    for i in tl.static_range(len(columns)):
        pieces = pieces + (tl.reshape(columns[i], (columns[i].shape[0], 1)),)
    for _ in tl.static_range(LOG2_WIDTH):
        joined = ()
        for i in tl.static_range(len(pieces) // 2):
            even = pieces[i]
            pair = tl.join(even, pieces[i + len(pieces) // 2])
            joined = joined + (tl.reshape(pair, (even.shape[0], 2 * even.shape[1])),)
        pieces = joined
    return pieces[0]


@triton.jit
def _row_offsets(t, K: tl.constexpr, LOG2_WIDTH: tl.constexpr):
    """Element offsets of the (rows, WIDTH) tile over rows t of the contiguous (T, K·3) params."""
    c = tl.arange(0, 1 << LOG2_WIDTH)
    return t[:, None] * (3 * K) + c[None, :], c < 3 * K


@triton.jit
def _load_rows(params_ptr, t, T, K: tl.constexpr, LOG2_WIDTH: tl.constexpr):
    """Rows t of params as a tuple of 2**LOG2_WIDTH (rows,) fp32 columns (zeros past K·3 or T)."""
    offsets, valid_c = _row_offsets(t, K, LOG2_WIDTH)
    tile = tl.load(params_ptr + offsets, mask=(t < T)[:, None] & valid_c[None, :], other=0.0)
    columns = _split_columns(tile, LOG2_WIDTH)  # split while still 2 bytes a value (bf16)
    as_fp32 = ()
    for i in tl.static_range(len(columns)):
        as_fp32 = as_fp32 + (columns[i].to(tl.float32),)
    return as_fp32


@triton.jit
def _mixture(
    columns, y, K: tl.constexpr, LOG2E_: tl.constexpr, LN2_: tl.constexpr, LOG_SQRT_2PI_: tl.constexpr
):
    """Per row: log p(y), and per component pi_k, r_k, z_k and e^{-s_k} for the backward.

    Column 3k + j of a row holds (w_k, mu_k, s_k)[j]. Base-2 exponents throughout: with
    x_k = w_k - max w, e_k = 2^(x_k·log2 e) are the unnormalised weights and
    b_k = (x_k - s_k - z_k²/2)·log2 e the log2 of the unnormalised joint, so that
    ln p(y) = ln 2·(log2 Σ 2^b - log2 Σ e) - log √(2π), each sum taken past its maximum.
    (The forward uses only log p; the compiler drops what it does not use.)
    """
    logit_max = columns[0]
    for k in tl.static_range(1, K):
        logit_max = tl.maximum(logit_max, columns[3 * k])
    e = ()
    b = ()
    z = ()
    inv_sigma = ()
    for k in tl.static_range(K):
        shifted = columns[3 * k] - logit_max
        inv_sigma_k = tl.exp2(columns[3 * k + 2] * -LOG2E_)
        z_k = (y - columns[3 * k + 1]) * inv_sigma_k
        e = e + (tl.exp2(shifted * LOG2E_),)
        b = b + ((shifted - columns[3 * k + 2]) * LOG2E_ - (0.5 * LOG2E_) * z_k * z_k,)
        z = z + (z_k,)
        inv_sigma = inv_sigma + (inv_sigma_k,)
    b_max = b[0]
    for k in tl.static_range(1, K):
        b_max = tl.maximum(b_max, b[k])
    sum_e = e[0]
    for k in tl.static_range(1, K):
        sum_e += e[k]
    joint = ()
    for k in tl.static_range(K):
        joint = joint + (tl.exp2(b[k] - b_max),)
    sum_joint = joint[0]
    for k in tl.static_range(1, K):
        sum_joint += joint[k]
    log_p = LN2_ * (b_max + tl.log2(sum_joint) - tl.log2(sum_e)) - LOG_SQRT_2PI_
    inv_sum_e = 1.0 / sum_e
    inv_sum_joint = 1.0 / sum_joint
    pi = ()
    r = ()
    for k in tl.static_range(K):
        pi = pi + (e[k] * inv_sum_e,)
        r = r + (joint[k] * inv_sum_joint,)
    return log_p, pi, r, z, inv_sigma


@triton.jit
def _gmm_nll_fwd_kernel(
    params_ptr,
    y_ptr,
    partials_ptr,
    counter_ptr,
    loss_ptr,
    T,
    stride_y,
    inv_T,
    K: tl.constexpr,
    LOG2_WIDTH: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_P: tl.constexpr,
    LOG2E_: tl.constexpr,
    LN2_: tl.constexpr,
    LOG_SQRT_2PI_: tl.constexpr,
):
    """A persistent grid: each program sums the NLL of its rows; the last one to finish adds the
    per-program partial sums in a fixed order, so the loss is the same bits on every run."""
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    nll_sum = tl.zeros([BLOCK_T], dtype=tl.float32)
    for row0 in range(pid * BLOCK_T, T, n_programs * BLOCK_T):
        t = row0 + tl.arange(0, BLOCK_T)
        columns = _load_rows(params_ptr, t, T, K, LOG2_WIDTH)
        y = tl.load(y_ptr + t * stride_y, mask=t < T, other=0.0).to(tl.float32)
        log_p, _, _, _, _ = _mixture(columns, y, K, LOG2E_, LN2_, LOG_SQRT_2PI_)
        nll_sum += tl.where(t < T, -log_p, 0.0)
    # Publish this program's sum, then count it in. Both are scalar atomics (one thread, in program
    # order; acq_rel), so whoever sees the count reach n_programs - 1 also sees every partial sum.
    # The partials travel as int32 bit patterns: atomic exchange is defined on every backend for those.
    tl.atomic_xchg(partials_ptr + pid, tl.sum(nll_sum, axis=0).to(tl.int32, bitcast=True))
    finished_before = tl.atomic_add(counter_ptr, 1)
    if finished_before == n_programs - 1:
        total = tl.zeros([BLOCK_P], dtype=tl.float32)
        for p0 in range(0, n_programs, BLOCK_P):
            p = p0 + tl.arange(0, BLOCK_P)
            bits = tl.load(partials_ptr + p, mask=p < n_programs, other=0, volatile=True)
            total += bits.to(tl.float32, bitcast=True)
        tl.store(loss_ptr, tl.sum(total, axis=0) * inv_T)
        tl.atomic_xchg(counter_ptr, 0)  # ready for the next call, with no memset launch


@triton.jit
def _gmm_nll_bwd_kernel(
    params_ptr,
    y_ptr,
    grad_loss_ptr,
    dparams_ptr,
    T,
    stride_y,
    inv_T,
    K: tl.constexpr,
    LOG2_WIDTH: tl.constexpr,
    BLOCK_T: tl.constexpr,
    LOG2E_: tl.constexpr,
    LN2_: tl.constexpr,
    LOG_SQRT_2PI_: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    columns = _load_rows(params_ptr, t, T, K, LOG2_WIDTH)
    y = tl.load(y_ptr + t * stride_y, mask=t < T, other=0.0).to(tl.float32)
    _, pi, r, z, inv_sigma = _mixture(columns, y, K, LOG2E_, LN2_, LOG_SQRT_2PI_)
    # The upstream gradient is read on the device: no host synchronization.
    scale = -tl.load(grad_loss_ptr).to(tl.float32) * inv_T
    grads = ()
    for k in tl.static_range(K):
        g = scale * r[k]
        grads = grads + (g - scale * pi[k], g * z[k] * inv_sigma[k], g * (z[k] * z[k] - 1.0))
    for _ in tl.static_range(3 * K, 1 << LOG2_WIDTH):
        grads = grads + (tl.zeros_like(y),)  # the masked columns past K·3
    # Round to the output dtype first: the tile then crosses shared memory at 2 bytes a value.
    rounded = ()
    for i in tl.static_range(len(grads)):
        rounded = rounded + (grads[i].to(dparams_ptr.dtype.element_ty),)
    offsets, valid_c = _row_offsets(t, K, LOG2_WIDTH)
    tl.store(
        dparams_ptr + offsets,
        _join_columns(rounded, LOG2_WIDTH),
        mask=(t < T)[:, None] & valid_c[None, :],
    )


# One row a thread (BLOCK_T = 32·warps): 64 rows at 2 warps won a sweep of 32-256 rows at 1-8 warps
# for both kernels at T = 4M on the H100; 16 forward programs an SM reached 87% of a copy, 8 or 24 less.
# The forward keeps _FWD_PROGRAMS_PER_SM programs on each SM and walks the rows with them.
_FWD_BLOCK_T, _FWD_WARPS, _FWD_PROGRAMS_PER_SM = 64, 2, 16
_BWD_BLOCK_T, _BWD_WARPS = 64, 2
_BLOCK_P = 1024  # partial sums the last program adds at a time
_COUNTERS: dict = {}


def _counter(device: torch.device) -> Tensor:
    """One zeroed int32 per device that the forward kernel counts on and resets itself.

    Shared by every call on the device, so two forward launches must not run concurrently on
    different streams (ordinary training runs one stream)."""
    key = str(device)
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(1, dtype=torch.int32, device=device)
    return _COUNTERS[key]


def _n_programs(T: int, device: torch.device) -> int:
    """The forward's grid: at most _FWD_PROGRAMS_PER_SM an SM, spread so each gets the same number
    of tiles (4M rows: 2048 programs of 32 tiles, not 2112 of 31 or 32)."""
    tiles = cdiv(T, _FWD_BLOCK_T)
    if device.type != "cuda":
        return min(tiles, 4)  # the interpreter: a few programs still cross the reduction path
    most = _FWD_PROGRAMS_PER_SM * sm_count(device)
    return cdiv(tiles, cdiv(tiles, most))


def _check(params: Tensor, y: Tensor) -> Tensor:
    if not isinstance(params, Tensor) or params.dim() != 3 or params.shape[2] != 3:
        raise ValueError(
            f"params: expected a (T, K, 3) tensor, got shape {tuple(getattr(params, 'shape', ()))}"
        )
    T, K = params.shape[0], params.shape[1]
    if T < 1 or K < 1:
        raise ValueError(
            f"params: needs T >= 1 targets and K >= 1 components, got shape {tuple(params.shape)}"
        )
    if K > 64:
        raise ValueError(f"params: at most 64 mixture components are supported, got K={K}")
    check_offset_range("params", T, 3 * K)
    if params.dtype not in _SUPPORTED_DTYPES:
        raise ValueError(
            f"params: dtype must be float32 or bfloat16 (fp16 gradients overflow), got {params.dtype}"
        )
    if not isinstance(y, Tensor) or y.shape not in {(T,), (T, 1)}:
        raise ValueError(
            f"y: expected shape ({T},) or ({T}, 1) to match params, got {tuple(getattr(y, 'shape', ()))}"
        )
    if not y.is_floating_point():
        raise ValueError(f"y: expected a floating-point tensor, got {y.dtype}")
    if y.device != params.device:
        raise ValueError(f"y: on {y.device}, but params is on {params.device}")
    check_tensor("params", params, _SUPPORTED_DTYPES)
    return y.reshape(T)


def _launch_constants(K: int, block_t: int, num_warps: int) -> dict:
    return {
        "K": K,
        "LOG2_WIDTH": (3 * K - 1).bit_length(),  # WIDTH = 3K rounded up to a power of two
        "BLOCK_T": block_t,
        "LOG2E_": _LOG2E,
        "LN2_": _LN2,
        "LOG_SQRT_2PI_": _LOG_SQRT_2PI,
        "num_warps": num_warps,
    }


# Triton's launcher re-derives on every call how each argument specialises the binary; the compiled
# kernel is kept instead and launched directly (tritonlab._launch.launch): 2-10 µs less host time a
# launch, where an autograd step's host time is close to the kernels' 0.28 ms at T = 4M. The key
# takes the signatures of the caller's tensors only: the other tensors are fresh buffers of ours,
# whose layouts follow from theirs and the grid.
_LAUNCHES = LaunchCache(first_launch)


def _forward(params: Tensor, y: Tensor) -> Tensor:
    """The loss, from contiguous params and y (T,): one launch of the forward kernel."""
    T, K, _ = params.shape
    n_programs = _n_programs(T, params.device)
    partials = torch.empty(n_programs, dtype=torch.int32, device=params.device)
    loss = torch.empty((), dtype=torch.float32, device=params.device)
    tensors = (params, y, partials, _counter(params.device), loss)
    constexprs = {"BLOCK_P": _BLOCK_P, **_launch_constants(K, _FWD_BLOCK_T, _FWD_WARPS)}
    scalars = (T, y.stride(0), 1.0 / T)
    launch(_LAUNCHES, _gmm_nll_fwd_kernel, (n_programs,), tensors, scalars, constexprs, (params, y))
    return loss


def _backward(params: Tensor, y: Tensor, grad_loss: Tensor) -> Tensor:
    """d loss / d params for the upstream gradient grad_loss: one launch of the backward kernel."""
    T, K, _ = params.shape
    dparams = torch.empty((T, K, 3), dtype=params.dtype, device=params.device)
    grad_loss = grad_loss.float().contiguous()
    tensors = (params, y, grad_loss, dparams)
    constexprs = _launch_constants(K, _BWD_BLOCK_T, _BWD_WARPS)
    scalars = (T, y.stride(0), 1.0 / T)
    grid = (cdiv(T, _BWD_BLOCK_T),)
    launch(_LAUNCHES, _gmm_nll_bwd_kernel, grid, tensors, scalars, constexprs, (params, y, grad_loss))
    return dparams


def _target_grad(dparams: Tensor, y: Tensor) -> Tensor:
    """dL/dy = -Σ_k dL/dmu_k: free from the params' gradient, if anyone asks (data usually does not)."""
    return -dparams[:, :, 1].float().sum(1).to(y.dtype)


class _GmmNll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, params: Tensor, y: Tensor) -> Tensor:
        ctx.save_for_backward(params, y)
        return _forward(params, y)

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        params, y = ctx.saved_tensors
        dparams = _backward(params, y, grad_loss)
        return dparams, _target_grad(dparams, y) if ctx.needs_input_grad[1] else None


# --- custom ops: the same launches, opaque to torch.compile ---------------------------------------


@torch.library.custom_op("tritonlab::gmm_nll_forward", mutates_args=())
def _gmm_nll_forward(params: Tensor, y: Tensor) -> Tensor:
    return _forward(params, y)


@_gmm_nll_forward.register_fake
def _(params, y):
    return params.new_empty((), dtype=torch.float32)


@torch.library.custom_op("tritonlab::gmm_nll_backward", mutates_args=())
def _gmm_nll_backward(params: Tensor, y: Tensor, grad_loss: Tensor) -> Tensor:
    return _backward(params, y, grad_loss)


@_gmm_nll_backward.register_fake
def _(params, y, grad_loss):
    return params.new_empty(params.shape)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward_formula(ctx, grad_loss):
    params, y = ctx.saved_tensors
    dparams = _gmm_nll_backward(params, y, grad_loss)
    return dparams, _target_grad(dparams, y) if ctx.needs_input_grad[1] else None


_gmm_nll_forward.register_autograd(_backward_formula, setup_context=_setup_context)


def gmm_nll(params: Tensor, y: Tensor) -> Tensor:
    """Mean negative log-likelihood of y under per-target Gaussian mixtures; drop-in for
    ``tritonlab.models.gmm_nll``.

    params (T, K, 3) = (logit_weight, mu, log_sigma) in fp32 or bf16 (any strides), y (T,) or
    (T, 1). Returns a float32 scalar; the backward writes only d params (T, K, 3).
    """
    y = _check(params, y)
    params = params.contiguous()  # the kernels read whole rows; a no-op for the heads' output
    if torch.compiler.is_compiling():
        return _gmm_nll_forward(params, y)
    # Eager: the autograd function directly, without the custom op dispatcher's host time per call.
    return _GmmNll.apply(params, y)


class GMMNLLLoss(nn.Module):
    """``gmm_nll`` as a loss module: ``loss = GMMNLLLoss()(params, y)``."""

    def forward(self, params: Tensor, y: Tensor) -> Tensor:
        return gmm_nll(params, y)
