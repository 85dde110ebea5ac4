"""The MLP y = silu(x W1ᵀ) W2ᵀ with its forward in one Triton kernel (GEMM + SiLU + GEMM).

Shapes follow nn.Linear: x (..., D_IN), w1 (D_FF, D_IN), w2 (N_OUT, D_FF); bf16, fp16 or fp32 with
fp32 accumulation (fp32: IEEE products unless ``torch.set_float32_matmul_precision`` allows TF32).

    a = x W1ᵀ,   h = silu(a) = a·σ(a),   y = h W2ᵀ
    dh = dy W2,  da = dh · σ(a)(1 + a(1 - σ(a))),  dx = da W1,  dW1 = daᵀ x,  dW2 = dyᵀ h

d_ff = 1365 is not a multiple of 16; every variant pads it to 1376 on each call (``pad_hidden``):
1365-long 16-bit rows are not 16-byte aligned, which keeps both cuBLAS and Triton off their fast paths.

Two one-kernel forwards, the same arithmetic with the hidden layer in a different place:
- **Staged in L2** (``_fused_mlp_staged_kernel``, ``fused_mlp``'s forward): a persistent program
  takes a block of 128 rows, computes its whole hidden row block h = silu(x W1ᵀ) tile by tile into a
  scratch buffer of its own (128 × D_FF, 352 KB in bf16; 46 MB for all programs on an H100, sized
  for its 50 MB L2), then multiplies it by W2ᵀ, and takes its next row block. Both products run on
  128 × 256 tiles, as a plain GEMM would, in one launch; x, W1 and W2 arrive through TMA descriptors.
- **In registers** (``tritonlab._gemm.fused_mlp_fwd_kernel``, ``fused_mlp_in_registers``): a program
  owns BLOCK_M rows × BLOCK_N outputs and accumulates y chunk by chunk of d_ff. A 512-wide fp32
  output accumulator fills the register file at 64 rows, so the products run on small tiles with
  nothing left to hide load latency; the grouped heads (``tritonlab.grouped_gemm``, 3 outputs a
  head) run this kernel, where that limit does not arise. Kept here to measure against the staged one.

Backward (every variant here): a (saved, or recomputed by cuBLAS) and dh = dy W2 (cuBLAS) meet in one
elementwise Triton kernel (``_silu_backward_kernel``) that writes da over dh and h; dx, dW1 and dW2
are cuBLAS GEMMs. Fusing dh = dy W2 into a Triton tile (``mlp_hidden_kernel``, which the 3-wide heads
want) is slower than cuBLAS's GEMM plus the separate pass at N_OUT = 512.

``gemm_silu_mlp`` is the two-kernel forward (a Triton GEMM with a SiLU epilogue, then cuBLAS);
``padded_cublas_mlp`` is eager's code on the padded weights, no Triton at all (what padding alone buys).

**torch.compile.** Dynamo cannot trace the autotuned launches, so while it traces, ``fused_mlp`` and
``fused_mlp_in_registers`` call the custom op ``tritonlab::fused_mlp_forward`` -- (y, the kept
pre-activation or an empty tensor), with a fake implementation giving their shapes and strides --
whose registered autograd formula calls ``tritonlab::fused_mlp_backward``: the same launches as the
eager route, as opaque nodes (the padding and autocast casts around them are traced). Eager calls
keep the plain autograd function, which skips the custom-op dispatcher's host time. ``record``
cannot cross a custom op: passing one while compiling is an error. ``gemm_silu_mlp`` stays eager-only.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor, nn
from triton.tools.tensor_descriptor import TensorDescriptor

from ._gemm import (
    FORWARD_KEY,
    T_BUCKETS,
    aligned_empty,
    autotuned_forward,
    autotuned_hidden,
    check_mlp_tensors,
    check_model_dim,
    check_weights_dtype,
    pad_hidden,
    shared_memory_pruner,
    silu_and_grad,
)
from ._launch import LaunchCache, first_launch, launch, tma_ok
from ._runtime import INTERPRET, cdiv, sm_count
from .tuning import ConfigRecord, dot_precision, pipelined_tile_bytes, refuse_record_under_compile
from .tuning_tables import autotune

__all__ = [
    "FusedMLP",
    "fused_mlp",
    "fused_mlp_in_registers",
    "gemm_silu_mlp",
    "pad_hidden",
    "padded_cublas_mlp",
]


@triton.jit
def _fused_mlp_staged_kernel(
    x_desc,
    w1_desc,
    w2_desc,
    y_ptr,
    a_ptr,
    scratch_ptr,
    T,
    D_FF,
    N_OUT,
    stride_yt,
    stride_at,
    stride_st,
    D_IN: tl.constexpr,
    SAVE_PREACT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_F: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_FK: tl.constexpr,
    STAGES_1: tl.constexpr,
    STAGES_2: tl.constexpr,
):
    """y = silu(x W1ᵀ) W2ᵀ, one persistent program per SM, each row block's h staged in L2.

    x, W1 and W2 arrive through TMA descriptors (x_desc blocks (BLOCK_M, BLOCK_K), w1_desc
    (BLOCK_F, BLOCK_K), w2_desc (BLOCK_N, BLOCK_FK)): the copy engine fetches the tiles, zero-fills
    rows past T or D_FF, and leaves the registers to the accumulators. The program's scratch is
    BLOCK_M rows of (programs · BLOCK_M, D_FF), read back by the same program only.
    """
    program, n_programs = tl.program_id(0), tl.num_programs(0)
    dtype = y_ptr.dtype.element_ty
    rows = tl.arange(0, BLOCK_M)
    scratch_ptr += program * BLOCK_M * stride_st
    for row_block in range(program, tl.cdiv(T, BLOCK_M), n_programs):
        m0 = row_block * BLOCK_M
        offs_m = m0 + rows
        # Phase 1: h = silu(x W1ᵀ) for this row block, (BLOCK_M, BLOCK_F) at a time, into the scratch.
        for f0 in range(0, D_FF, BLOCK_F):
            offs_f = f0 + tl.arange(0, BLOCK_F)
            acc = tl.zeros((BLOCK_M, BLOCK_F), dtype=tl.float32)
            for k0 in tl.range(0, D_IN, BLOCK_K, num_stages=STAGES_1):
                acc = tl.dot(
                    x_desc.load([m0, k0]), w1_desc.load([f0, k0]).T, acc, input_precision=DOT_PRECISION
                )
            # Rounded to the input dtype as eager's GEMM output is, so a saved `a` and this h agree.
            a = acc.to(dtype)
            in_f = (offs_f < D_FF)[None, :]
            if SAVE_PREACT:
                tl.store(
                    a_ptr + offs_m[:, None] * stride_at + offs_f[None, :],
                    a,
                    mask=(offs_m < T)[:, None] & in_f,
                )
            h, _ = silu_and_grad(a.to(tl.float32), dtype)
            tl.store(scratch_ptr + rows[:, None] * stride_st + offs_f[None, :], h.to(dtype), mask=in_f)
        # Every warp's h tiles must be in place before any warp reads the row block back.
        tl.debug_barrier()
        # Phase 2: y = h W2ᵀ for this row block, (BLOCK_M, BLOCK_N) at a time, K = D_FF.
        for n0 in range(0, N_OUT, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            acc_y = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for f0 in tl.range(0, D_FF, BLOCK_FK, num_stages=STAGES_2):
                f = f0 + tl.arange(0, BLOCK_FK)
                h = tl.load(
                    scratch_ptr + rows[:, None] * stride_st + f[None, :], mask=(f < D_FF)[None, :], other=0.0
                )
                acc_y = tl.dot(h, w2_desc.load([n0, f0]).T, acc_y, input_precision=DOT_PRECISION)
            tl.store(
                y_ptr + offs_m[:, None] * stride_yt + offs_n[None, :],
                acc_y.to(dtype),
                mask=(offs_m < T)[:, None] & (offs_n < N_OUT)[None, :],
            )
        # ...and all reads done before the next row block overwrites the scratch.
        tl.debug_barrier()


@triton.jit
def _silu_backward_kernel(a_ptr, dh_ptr, h_ptr, da_ptr, n, BLOCK: tl.constexpr):
    """h = silu(a) and da = dh · silu'(a) over n contiguous values; h and da may alias a and dh."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    h, dsilu = silu_and_grad(tl.load(a_ptr + offs, mask=mask).to(tl.float32), h_ptr.dtype.element_ty)
    dh = tl.load(dh_ptr + offs, mask=mask).to(tl.float32)
    tl.store(h_ptr + offs, h.to(h_ptr.dtype.element_ty), mask=mask)
    tl.store(da_ptr + offs, (dh * dsilu).to(da_ptr.dtype.element_ty), mask=mask)


# --- config spaces --------------------------------------------------------------------------------
# The interpreter gets one config each: it cannot time, and one is all a correctness check needs.

# The register forward, (BLOCK_M, BLOCK_N, BLOCK_F, BLOCK_K, warps, stages). A 512-wide output
# accumulator holds BLOCK_M·512 fp32 in registers: at BLOCK_M = 64 and 8 warps that is 128 registers
# a thread. Splitting the output in two halves the registers and doubles the first GEMM; the
# autotuner measures both.
_REGISTER_TILES = [
    (64, 256, 64, 64, 8, 3),
    (128, 256, 64, 64, 8, 3),
    (64, 512, 64, 64, 8, 3),
    (64, 512, 32, 64, 8, 3),
]
# The hidden kernel's forward mode (GEMM + SiLU, writing a and h): the best of a sweep of 20 tiles at
# T = 44 000 was 128 x 128 / 8 warps.
_HIDDEN_TILES = [(128, 64, 128, 64, 8, 3), (64, 64, 128, 64, 4, 3), (128, 64, 256, 64, 8, 3)]
_CPU_TILES = [(64, 128, 128, 256, 4, 1)]

# The staged forward: every program takes STAGED_BLOCK_M rows (its scratch is sized by it). Tiles
# (BLOCK_F, BLOCK_K, BLOCK_N, BLOCK_FK, warps, stages of phase 1 and of phase 2): the four fastest of
# a probe at T = 44 000 and 205 000 in bf16. None fits the H100's 227 KB of shared memory with 4-byte
# elements (294 912 B for the first), so float32 gets the smaller fallbacks, whose boxes are also
# TMA's 128-byte swizzle width at 4 bytes.
_STAGED_BLOCK_M = 16 if INTERPRET else 128
_STAGED_TILES = [
    (256, 64, 256, 64, 8, 3, 3),
    (256, 64, 256, 64, 8, 4, 4),
    (128, 64, 256, 64, 8, 4, 3),
    (128, 128, 256, 64, 8, 3, 3),
]
_STAGED_FALLBACK_TILES = [(128, 32, 128, 32, 8, 3, 3), (128, 32, 256, 32, 8, 2, 2)]
_STAGED_CPU_TILES = [(32, 32, 32, 32, 1, 1, 1)]


def _set_tma_blocks(nargs: dict) -> None:
    """A config's tile shapes, given to the TMA descriptors before it launches (autotuning included)."""
    nargs["x_desc"].block_shape = [_STAGED_BLOCK_M, nargs["BLOCK_K"]]
    nargs["w1_desc"].block_shape = [nargs["BLOCK_F"], nargs["BLOCK_K"]]
    nargs["w2_desc"].block_shape = [nargs["BLOCK_N"], nargs["BLOCK_FK"]]


def _staged_configs(tiles) -> list[triton.Config]:
    return [
        triton.Config(
            {"BLOCK_F": f, "BLOCK_K": k, "BLOCK_N": n, "BLOCK_FK": fk, "STAGES_1": s1, "STAGES_2": s2},
            num_warps=warps,
            pre_hook=_set_tma_blocks,
        )
        for f, k, n, fk, warps, s1, s2 in tiles
    ]


def _staged_smem(config: triton.Config, element_size: int) -> int:
    """Shared memory of the staged forward: the larger of its two pipelined loops (the compiler
    reuses the buffers between them), plus its barriers."""
    kw = config.kwargs
    first = pipelined_tile_bytes(
        (_STAGED_BLOCK_M + kw["BLOCK_F"]) * kw["BLOCK_K"], element_size, kw["STAGES_1"]
    )
    second = pipelined_tile_bytes(
        (_STAGED_BLOCK_M + kw["BLOCK_N"]) * kw["BLOCK_FK"], element_size, kw["STAGES_2"]
    )
    return max(first, second) + 1024


_STAGED_FALLBACK = [] if INTERPRET else _staged_configs(_STAGED_FALLBACK_TILES)
_STAGED_CONFIGS = _staged_configs(_STAGED_CPU_TILES if INTERPRET else _STAGED_TILES) + _STAGED_FALLBACK

_fused_mlp_staged = autotune(
    _STAGED_CONFIGS,
    name="mlp.staged_forward",
    phase="06_fused_mlp",
    key=FORWARD_KEY,
    dtype_arg="y_ptr",
    buckets=T_BUCKETS,
    runs_on_sm80=lambda config: False,  # its loads are TMA descriptors: sm_90 only
    prune_configs_by={"early_config_prune": shared_memory_pruner(_staged_smem, "y_ptr", _STAGED_FALLBACK)},
)(_fused_mlp_staged_kernel)
_fused_mlp_registers = autotuned_forward(
    _CPU_TILES if INTERPRET else _REGISTER_TILES, "mlp.register_forward", "06_fused_mlp"
)
_mlp_hidden = autotuned_hidden(_CPU_TILES if INTERPRET else _HIDDEN_TILES, "mlp.gemm_silu", "06_fused_mlp")


# --- launch wrappers ------------------------------------------------------------------------------


def _note(record: ConfigRecord | None, name: str, autotuner) -> None:
    if record is not None:
        record.note(name, autotuner.best_config)


def _forward_in_registers(x: Tensor, w1: Tensor, w2: Tensor, a: Tensor | None, record) -> Tensor:
    """y from ``fused_mlp_fwd_kernel``, writing the pre-activation into ``a`` if one is given."""
    T, D_IN = x.shape
    D_FF, N_OUT = w1.shape[0], w2.shape[0]
    y = torch.empty((T, N_OUT), dtype=x.dtype, device=x.device)
    a_strides = (a.stride(0), 0, a.stride(1)) if a is not None else (0, 0, 0)

    def grid(meta):
        return cdiv(T, meta["BLOCK_M"]), cdiv(N_OUT, meta["BLOCK_N"]), 1

    _fused_mlp_registers[grid](
        x, w1, w2, y, a, T, D_FF, N_OUT,
        *x.stride(), 0, *w1.stride(), 0, *w2.stride(), y.stride(0), 0, y.stride(1), *a_strides,
        D_IN=D_IN, SAVE_PREACT=a is not None, DOT_PRECISION=dot_precision(x.dtype),
    )  # fmt: skip
    _note(record, "registers", _fused_mlp_registers)
    return y


def _tma_ready(t: Tensor) -> Tensor:
    """t itself if a TMA descriptor can address it, else a fresh dense copy (``contiguous()`` would
    return a misaligned dense view as is)."""
    return t if tma_ok(t) else t.clone(memory_format=torch.contiguous_format)


def _forward_staged(x: Tensor, w1: Tensor, w2: Tensor, a: Tensor | None, record) -> Tensor:
    """y from the staged kernel: one program per SM (at most one per row block), each with a scratch
    of _STAGED_BLOCK_M hidden rows; writes the pre-activation into ``a`` if one is given."""
    x, w1, w2 = _tma_ready(x), _tma_ready(w1), _tma_ready(w2)
    T, D_IN = x.shape
    D_FF, N_OUT = w1.shape[0], w2.shape[0]
    n_programs = min(cdiv(T, _STAGED_BLOCK_M), sm_count(x.device))
    scratch = aligned_empty(n_programs * _STAGED_BLOCK_M, D_FF, x)
    y = torch.empty((T, N_OUT), dtype=x.dtype, device=x.device)
    # Block shapes are placeholders: each config's pre_hook sets its own.
    descriptors = [TensorDescriptor.from_tensor(t, [16, 16]) for t in (x, w1, w2)]
    _fused_mlp_staged[(n_programs,)](
        *descriptors, y, a, scratch, T, D_FF, N_OUT,
        y.stride(0), a.stride(0) if a is not None else 0, scratch.stride(0),
        D_IN=D_IN, SAVE_PREACT=a is not None, DOT_PRECISION=dot_precision(x.dtype), BLOCK_M=_STAGED_BLOCK_M,
    )  # fmt: skip
    _note(record, "staged", _fused_mlp_staged)
    return y


def _forward_gemm_silu(x: Tensor, w1: Tensor, w2: Tensor, record) -> tuple[Tensor, Tensor]:
    """a = x W1ᵀ and h = silu(a), written side by side by the hidden kernel's forward mode."""
    T, D_IN = x.shape
    D_FF = w1.shape[0]
    a, h = aligned_empty(T, D_FF, x), aligned_empty(T, D_FF, x)

    def grid(meta):
        return cdiv(T, meta["BLOCK_M"]), cdiv(D_FF, meta["BLOCK_F"]), 1

    _mlp_hidden[grid](
        x, w1, w2, a, None, None, h, None, T, D_FF, w2.shape[0],
        *x.stride(), 0, *w1.stride(), 0, *w2.stride(), a.stride(0), 0, a.stride(1), *(0,) * 6,
        D_IN=D_IN, RECOMPUTE_A=True, WRITE_A=True, HAS_DY=False, WRITE_H=True, DW2_PARTIALS=False,
        DOT_PRECISION=dot_precision(x.dtype),
    )  # fmt: skip
    _note(record, "hidden", _mlp_hidden)
    return a, h


def _fused_forward(
    x: Tensor, w1: Tensor, w2: Tensor, save_preactivation: bool, in_registers: bool, record
) -> tuple[Tensor, Tensor | None]:
    """y from the staged or the register forward, and the pre-activation a if it is to be kept."""
    a = aligned_empty(x.shape[0], w1.shape[0], x) if save_preactivation else None
    return (_forward_in_registers if in_registers else _forward_staged)(x, w1, w2, a, record), a


_SILU_BLOCK = 4096  # values a program of the elementwise SiLU backward takes


def _hidden_grads(x: Tensor, w1: Tensor, w2: Tensor, a: Tensor | None, dy: Tensor) -> tuple[Tensor, Tensor]:
    """da = (dy W2) · silu'(a) and h = silu(a), with a saved or recomputed as x W1ᵀ.

    The two products go to cuBLAS; the elementwise step is one Triton pass that writes da over dh
    and, when a was recomputed here, h over a (a saved a stays intact: autograd may backpropagate
    through the same graph again)."""
    recomputed = a is None
    a = x @ w1.t() if recomputed else a
    dh = dy @ w2
    h = a if recomputed else torch.empty_like(a)
    n = a.numel()
    assert a.is_contiguous() and dh.is_contiguous(), "D_FF is padded to a multiple of 16: rows are dense"
    launch(
        _SILU_LAUNCHES, _silu_backward_kernel, (cdiv(n, _SILU_BLOCK),), (a, dh, h, dh), (n,),
        {"BLOCK": _SILU_BLOCK, "num_warps": 8},
    )  # fmt: skip
    return dh, h


_SILU_LAUNCHES = LaunchCache(first_launch)  # the SiLU backward's direct launches


def _mlp_backward(
    x: Tensor, w1: Tensor, w2: Tensor, a: Tensor | None, dy: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """dx = da W1, dW1 = daᵀ x, dW2 = dyᵀ h on cuBLAS, from what the forward saved: x, W1, W2 and a
    (or None, to recompute it). dW2 is computed as (hᵀ dy)ᵀ, so the GEMM writes a (D_FF, N_OUT)
    matrix with aligned rows; the gradient is its transposed view."""
    dy = dy.contiguous()
    da, h = _hidden_grads(x, w1, w2, a, dy)
    return da @ w1, da.t() @ x, (h.t() @ dy).t()


# --- autograd functions ---------------------------------------------------------------------------


class _FusedMLP(torch.autograd.Function):
    """One-kernel forward (staged in L2, or in registers); the backward keeps a or recomputes it."""

    @staticmethod
    def forward(ctx, x, w1, w2, save_preactivation: bool, in_registers: bool, record):
        y, a = _fused_forward(x, w1, w2, save_preactivation, in_registers, record)
        ctx.save_for_backward(x, w1, w2, a)
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        return *_mlp_backward(*ctx.saved_tensors, dy), None, None, None


class _GemmSiluThenCublas(torch.autograd.Function):
    """The two-kernel forward: a Triton GEMM with a SiLU epilogue writes a and h, cuBLAS does h W2ᵀ."""

    @staticmethod
    def forward(ctx, x, w1, w2, record):
        a, h = _forward_gemm_silu(x, w1, w2, record)
        ctx.save_for_backward(x, w1, w2, a)
        return h @ w2.t()

    @staticmethod
    def backward(ctx, dy: Tensor):
        return *_mlp_backward(*ctx.saved_tensors, dy), None


# --- custom ops: the same launches, opaque to torch.compile ---------------------------------------


@torch.library.custom_op("tritonlab::fused_mlp_forward", mutates_args=())
def _fused_mlp_forward(
    x: Tensor, w1: Tensor, w2: Tensor, save_preactivation: bool, in_registers: bool
) -> tuple[Tensor, Tensor]:
    """(y, a): a is the pre-activation the backward reads with ``save_preactivation``, else empty."""
    y, a = _fused_forward(x, w1, w2, save_preactivation, in_registers, None)
    return y, a if a is not None else x.new_empty(0)


@_fused_mlp_forward.register_fake
def _(x, w1, w2, save_preactivation, in_registers):
    y = x.new_empty((x.shape[0], w2.shape[0]))
    return y, aligned_empty(x.shape[0], w1.shape[0], x) if save_preactivation else x.new_empty(0)


@torch.library.custom_op("tritonlab::fused_mlp_backward", mutates_args=())
def _fused_mlp_backward(
    x: Tensor, w1: Tensor, w2: Tensor, a: Tensor | None, dy: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    return _mlp_backward(x, w1, w2, a, dy)


@_fused_mlp_backward.register_fake
def _(x, w1, w2, a, dy):
    # Dense GEMM outputs whatever the inputs' strides; dW2 the transposed view of a (D_FF, N_OUT) one.
    return x.new_empty(x.shape), x.new_empty(w1.shape), x.new_empty((w2.shape[1], w2.shape[0])).t()


def _setup_context(ctx, inputs, output):
    x, w1, w2, save_preactivation, _ = inputs
    _, a = output
    ctx.mark_non_differentiable(a)
    ctx.set_materialize_grads(False)  # no zero-filled gradient for a
    ctx.save_for_backward(x, w1, w2, a if save_preactivation else None)


def _backward_formula(ctx, dy, _grad_a):
    return *_fused_mlp_backward(*ctx.saved_tensors, dy), None, None


_fused_mlp_forward.register_autograd(_backward_formula, setup_context=_setup_context)


def _fused_mlp(x, w1, w2, save_preactivation: bool, in_registers: bool, record, name: str) -> Tensor:
    """``_FusedMLP`` on checked, padded inputs -- or, while torch.compile traces, the custom op."""
    if torch.compiler.is_compiling():
        refuse_record_under_compile(record, name)
        return _fused_mlp_forward(x, w1, w2, save_preactivation, in_registers)[0]
    # Eager: the autograd function directly, without the custom op dispatcher's host time per call.
    return _FusedMLP.apply(x, w1, w2, save_preactivation, in_registers, record)


# --- public functions -----------------------------------------------------------------------------


def _check_mlp_inputs(x: Tensor, w1: Tensor, w2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Validate x (..., D_IN), w1 (D_FF, D_IN), w2 (N_OUT, D_FF); return them flattened to 2-D and cast
    to the compute dtype (under autocast fp32 weights become bf16; the cast is differentiable)."""
    check_mlp_tensors(("x", "w1", "w2"), x, w1, w2)
    if x.dim() < 1 or w1.dim() != 2 or w2.dim() != 2:
        raise ValueError(
            f"shapes: expected x (..., D_IN), w1 (D_FF, D_IN), w2 (N_OUT, D_FF); got x "
            f"{tuple(x.shape)}, w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)}"
        )
    if w1.shape[1] != x.shape[-1]:
        raise ValueError(f"w1: expected (D_FF, {x.shape[-1]}) to match x's last dim, got {tuple(w1.shape)}")
    if w2.shape[1] != w1.shape[0]:
        raise ValueError(f"w2: expected (N_OUT, {w1.shape[0]}) to match w1's D_FF, got {tuple(w2.shape)}")
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    check_model_dim("x", rows, x.shape[-1], max(x.shape[-1], cdiv(w1.shape[0], 16) * 16, w2.shape[0]))
    dtype = check_weights_dtype(("x", "w1", "w2"), x, w1, w2)
    return x.reshape(-1, x.shape[-1]).to(dtype), w1.to(dtype), w2.to(dtype)


def fused_mlp(
    x: Tensor, w1: Tensor, w2: Tensor, *, save_preactivation: bool = False, record: ConfigRecord | None = None
) -> Tensor:
    """silu(x W1ᵀ) W2ᵀ with the forward in one Triton kernel; drop-in for ``tritonlab.models.mlp_eager``.

    x (..., D_IN), w1 (D_FF, D_IN), w2 (N_OUT, D_FF), D_IN a multiple of 16. Under autocast fp32
    weights are cast to the autocast dtype, as F.linear does. The forward stages each row block's
    hidden layer in L2. By default nothing is saved beyond the inputs and the backward recomputes
    a = x W1ᵀ: 3.5× less memory kept for the backward, for one more GEMM there;
    ``save_preactivation=True`` keeps a (T·D_FF values) instead. ``record`` receives the tiles the
    forward's autotuner picked (eager calls only, not under torch.compile).
    """
    x2, w1, w2 = _check_mlp_inputs(x, w1, w2)
    y = _fused_mlp(x2, *pad_hidden(w1, w2), save_preactivation, False, record, "fused_mlp")
    return y.reshape(*x.shape[:-1], w2.shape[0])


def fused_mlp_in_registers(
    x: Tensor, w1: Tensor, w2: Tensor, *, record: ConfigRecord | None = None
) -> Tensor:
    """The same MLP with the register-resident one-kernel forward (the hidden layer never leaves the
    registers); saves nothing, as ``fused_mlp``. Slower than ``fused_mlp`` at d_model 512."""
    x2, w1, w2 = _check_mlp_inputs(x, w1, w2)
    y = _fused_mlp(x2, *pad_hidden(w1, w2), False, True, record, "fused_mlp_in_registers")
    return y.reshape(*x.shape[:-1], w2.shape[0])


def gemm_silu_mlp(x: Tensor, w1: Tensor, w2: Tensor, *, record: ConfigRecord | None = None) -> Tensor:
    """The same MLP with a two-kernel forward: Triton GEMM + SiLU (writing a and h), then cuBLAS."""
    x2, w1, w2 = _check_mlp_inputs(x, w1, w2)
    return _GemmSiluThenCublas.apply(x2, *pad_hidden(w1, w2), record).reshape(*x.shape[:-1], w2.shape[0])


def padded_cublas_mlp(x: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    """The eager MLP (two cuBLAS GEMMs and PyTorch's SiLU) on weights padded by ``pad_hidden``:
    what padding alone buys, with no Triton kernel. Autograd saves a and h, as in eager."""
    x2, w1, w2 = _check_mlp_inputs(x, w1, w2)
    w1, w2 = pad_hidden(w1, w2)
    y = torch.nn.functional.silu(x2 @ w1.t()) @ w2.t()
    return y.reshape(*x.shape[:-1], w2.shape[0])


class FusedMLP(nn.Module):
    """``fused_mlp`` with its weights: d_model -> d_ff -> d_out (default d_model), no biases, weights
    initialised as nn.Linear's."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        d_out: int | None = None,
        *,
        save_preactivation=False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff, bias=False, device=device, dtype=dtype)
        self.fc2 = nn.Linear(d_ff, d_out or d_model, bias=False, device=device, dtype=dtype)
        self.save_preactivation = save_preactivation

    def forward(self, x: Tensor) -> Tensor:
        return fused_mlp(x, self.fc1.weight, self.fc2.weight, save_preactivation=self.save_preactivation)
