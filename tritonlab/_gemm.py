"""What ``tritonlab.mlp`` and ``tritonlab.grouped_gemm`` share (internal: no public API here).

Both compute MLPs y = silu(x W1ᵀ) W2ᵀ, the grouped heads with a group axis (w1 (G, D_FF, D_IN),
w2 (G, N_OUT, D_FF), one output slice per group), so both run the same two kernels:

- ``fused_mlp_fwd_kernel``: the forward with the hidden layer in registers. A program owns BLOCK_M
  rows and BLOCK_N output columns of one group and walks the hidden dimension in chunks: a chunk's
  a = x W1ᵀ, SiLU, and its share of h W2ᵀ accumulated into y, all in registers.
- ``mlp_hidden_kernel``: one (BLOCK_M, BLOCK_F) tile of the hidden layer -- a loaded or recomputed,
  h = silu(a), and with an upstream gradient da = (dy W2) · silu'(a) and this row block's share of
  dW2 = dyᵀ h.

and the same host helpers: the tile configs and their pruning by shared memory, the padding of
d_ff to 16-byte aligned rows, aligned scratch, the compute dtype under autocast and input checks.

SiLU's sigmoid is ½ + ½·tanh(a/2) with PTX's ``tanh.approx.f32``: one special-function instruction
a value where the exact sigmoid's exponential and reciprocal take two. Over a 128 × 256 tile that
unit bounded the staged forward's epilogue (phase 06's README: 0.371 -> 0.307 ms at mid). Its error,
about 2^-11 relative, is below bf16 and fp16 rounding, so 16-bit outputs use it; fp32, and the
interpreter (no inline PTX), keep the exact sigmoid.

Every ``tl.dot`` takes ``DOT_PRECISION`` (``tritonlab.tuning.dot_precision``): float32 inputs get
IEEE products unless PyTorch allows TF32.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import tuning, tuning_tables
from ._runtime import INTERPRET, autocast_dtype, cdiv
from .checks import check_offset_range, check_tensor

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FAST_TANH = tl.constexpr(not INTERPRET)


@triton.jit
def sigmoid(a, out_dtype: tl.constexpr):
    """sigmoid of an fp32 tile whose results end up rounded to out_dtype."""
    if FAST_TANH and out_dtype != tl.float32:
        tanh = tl.inline_asm_elementwise(
            "tanh.approx.f32 $0, $1;", "=r,r", [0.5 * a], dtype=tl.float32, is_pure=True, pack=1
        )
        return 0.5 + 0.5 * tanh
    else:
        return tl.sigmoid(a)


@triton.jit
def silu_and_grad(a, out_dtype: tl.constexpr):
    """silu(a) and its derivative s·(1 + a·(1 - s)), s = sigmoid(a); fp32 in and out."""
    s = sigmoid(a, out_dtype)
    return a * s, s * (1.0 + a * (1.0 - s))


@triton.jit
def preactivation(
    x_ptr,
    w1_ptr,
    offs_m,
    offs_f,
    T,
    D_FF,
    stride_xt,
    stride_xk,
    stride_w1f,
    stride_w1k,
    D_IN: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_F: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """a = x[offs_m] · W1[offs_f]ᵀ, a (BLOCK_M, BLOCK_F) fp32 accumulator."""
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_F), dtype=tl.float32)
    for k0 in range(0, D_IN, BLOCK_K):
        k = k0 + offs_k
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xt + k[None, :] * stride_xk,
            mask=(offs_m < T)[:, None] & (k < D_IN)[None, :],
            other=0.0,
        )
        w1t = tl.load(
            w1_ptr + offs_f[None, :] * stride_w1f + k[:, None] * stride_w1k,
            mask=(offs_f < D_FF)[None, :] & (k < D_IN)[:, None],
            other=0.0,
        )
        acc = tl.dot(x, w1t, acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def fused_mlp_fwd_kernel(
    x_ptr, w1_ptr, w2_ptr, y_ptr, a_ptr, T, D_FF, N_OUT,
    stride_xt, stride_xk, stride_w1g, stride_w1f, stride_w1k, stride_w2g, stride_w2n, stride_w2f,
    stride_yt, stride_yg, stride_yn, stride_at, stride_ag, stride_af,
    D_IN: tl.constexpr, SAVE_PREACT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """y[rows, group, cols] = silu(x W1_gᵀ) W2_gᵀ with the hidden layer in registers; grid
    (row blocks, output blocks, groups). SAVE_PREACT also writes a (from the first output block)."""
    pid_m, pid_n, group = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w1_ptr += group * stride_w1g
    w2_ptr += group * stride_w2g
    dtype = x_ptr.dtype.element_ty
    acc_y = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for f0 in range(0, D_FF, BLOCK_F):
        offs_f = f0 + tl.arange(0, BLOCK_F)
        a = preactivation(x_ptr, w1_ptr, offs_m, offs_f, T, D_FF, stride_xt, stride_xk, stride_w1f, stride_w1k,
                          D_IN, BLOCK_M, BLOCK_F, BLOCK_K, DOT_PRECISION).to(dtype)  # fmt: skip
        # Rounded to the input dtype as eager's GEMM output is, so a saved `a` and this h agree.
        if SAVE_PREACT and pid_n == 0:
            tl.store(
                a_ptr + group * stride_ag + offs_m[:, None] * stride_at + offs_f[None, :] * stride_af,
                a,
                mask=(offs_m < T)[:, None] & (offs_f < D_FF)[None, :],
            )
        h, _ = silu_and_grad(a.to(tl.float32), dtype)
        w2t = tl.load(
            w2_ptr + offs_f[:, None] * stride_w2f + offs_n[None, :] * stride_w2n,
            mask=(offs_f < D_FF)[:, None] & (offs_n < N_OUT)[None, :],
            other=0.0,
        )
        acc_y = tl.dot(h.to(dtype), w2t, acc_y, input_precision=DOT_PRECISION)
    tl.store(
        y_ptr + offs_m[:, None] * stride_yt + group * stride_yg + offs_n[None, :] * stride_yn,
        acc_y.to(y_ptr.dtype.element_ty),
        mask=(offs_m < T)[:, None] & (offs_n < N_OUT)[None, :],
    )


@triton.jit
def mlp_hidden_kernel(
    x_ptr, w1_ptr, w2_ptr, a_ptr, dy_ptr, da_ptr, h_ptr, dw2_partial_ptr, T, D_FF, N_OUT,
    stride_xt, stride_xk, stride_w1g, stride_w1f, stride_w1k, stride_w2g, stride_w2n, stride_w2f,
    stride_at, stride_ag, stride_af, stride_dyt, stride_dyg, stride_dyn, stride_pm, stride_pg, stride_pn,
    D_IN: tl.constexpr, RECOMPUTE_A: tl.constexpr, WRITE_A: tl.constexpr, HAS_DY: tl.constexpr,
    WRITE_H: tl.constexpr, DW2_PARTIALS: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """One (BLOCK_M, BLOCK_F) tile of the hidden layer of group program_id(2).

    a comes from `a_ptr` or is recomputed from x and W1 (RECOMPUTE_A); with HAS_DY the tile's
    dh = dy W2 gives da = dh·silu'(a), written to `da_ptr`. WRITE_A / WRITE_H store a and h = silu(a)
    (a forward with a cuBLAS second layer uses this kernel with HAS_DY off). DW2_PARTIALS writes
    this row block's share of dW2 = dyᵀ h, to be summed over row blocks by the caller: for an output
    as narrow as 3 columns that is cheaper than writing h for a GEMM.
    da, a and h share the (T, G·D_FF) layout given by stride_at/ag/af.
    """
    pid_m, pid_f, group = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_f = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    mask_mf = (offs_m < T)[:, None] & (offs_f < D_FF)[None, :]
    hidden_offsets = group * stride_ag + offs_m[:, None] * stride_at + offs_f[None, :] * stride_af
    dtype = (da_ptr if HAS_DY else h_ptr).dtype.element_ty
    if RECOMPUTE_A:
        a = preactivation(x_ptr, w1_ptr + group * stride_w1g, offs_m, offs_f, T, D_FF, stride_xt, stride_xk,
                          stride_w1f, stride_w1k, D_IN, BLOCK_M, BLOCK_F, BLOCK_K, DOT_PRECISION).to(dtype)  # fmt: skip
        if WRITE_A:
            tl.store(a_ptr + hidden_offsets, a, mask=mask_mf)
    else:
        a = tl.load(a_ptr + hidden_offsets, mask=mask_mf, other=0.0)
    h, dsilu = silu_and_grad(a.to(tl.float32), dtype)
    if WRITE_H:
        tl.store(h_ptr + hidden_offsets, h.to(dtype), mask=mask_mf)
    if HAS_DY:
        offs_n = tl.arange(0, BLOCK_N)
        dh = tl.zeros((BLOCK_M, BLOCK_F), dtype=tl.float32)
        for n0 in range(0, N_OUT, BLOCK_N):
            n = n0 + offs_n
            dy = tl.load(
                dy_ptr + group * stride_dyg + offs_m[:, None] * stride_dyt + n[None, :] * stride_dyn,
                mask=(offs_m < T)[:, None] & (n < N_OUT)[None, :],
                other=0.0,
            )
            w2 = tl.load(
                w2_ptr + group * stride_w2g + n[:, None] * stride_w2n + offs_f[None, :] * stride_w2f,
                mask=(n < N_OUT)[:, None] & (offs_f < D_FF)[None, :],
                other=0.0,
            )
            dh = tl.dot(dy, w2, dh, input_precision=DOT_PRECISION)
            if DW2_PARTIALS:  # this block's dyᵀ h; N_OUT <= BLOCK_N, so once per tile
                part = tl.dot(tl.trans(dy), h.to(dtype), input_precision=DOT_PRECISION)
                tl.store(
                    dw2_partial_ptr
                    + pid_m * stride_pm
                    + group * stride_pg
                    + n[:, None] * stride_pn
                    + offs_f[None, :],
                    part,
                    mask=(n < N_OUT)[:, None] & (offs_f < D_FF)[None, :],
                )
        tl.store(da_ptr + hidden_offsets, (dh * dsilu).to(dtype), mask=mask_mf)


# --- tile configs, pruned by the GPU's shared memory ---------------------------------------------

TILE_NAMES = ("BLOCK_M", "BLOCK_N", "BLOCK_F", "BLOCK_K")


def tile_configs(tiles) -> list[triton.Config]:
    """(BLOCK_M, BLOCK_N, BLOCK_F, BLOCK_K, warps, stages) tuples as autotuner configs."""
    return [
        triton.Config(dict(zip(TILE_NAMES, t[:4], strict=True)), num_warps=t[4], num_stages=t[5])
        for t in tiles
    ]


def register_forward_smem(config: triton.Config, element_size: int) -> int:
    """Shared memory of ``fused_mlp_fwd_kernel``: the pipelined x and W1 tiles of the inner loop,
    one W2 chunk, and h on its way to the second dot."""
    m, n, f, k = (config.kwargs[name] for name in TILE_NAMES)
    inner = tuning.pipelined_tile_bytes(m * k + k * f, element_size, config.num_stages)
    return inner + (f * n + m * f) * element_size


def hidden_kernel_smem(config: triton.Config, element_size: int) -> int:
    """Shared memory of ``mlp_hidden_kernel``: the larger of its two pipelined loops (x·W1ᵀ and
    dy·W2), and h on its way to the dW2 partial's dot."""
    m, n, f, k = (config.kwargs[name] for name in TILE_NAMES)
    loop = max(m * k + k * f, m * n + n * f)
    return tuning.pipelined_tile_bytes(loop, element_size, config.num_stages) + m * f * element_size


def fitting_configs(configs, element_size: int, estimate, fallback=(), device_index=None) -> list:
    """The configs whose shared memory (``estimate(config, element_size)`` bytes) fits this GPU.

    ``fallback`` configs (in ``configs`` too: smaller tiles for 4-byte elements) join only where none
    of the others fits, so 16-bit inputs are tuned over the measured space alone. Where nothing fits
    the smallest config is kept: the compiler's error then names the shortfall.
    """
    fallback_ids = {id(c) for c in fallback}
    fits = [c for c in configs if tuning.fits_shared_memory(estimate(c, element_size), device_index)]
    primary = [c for c in fits if id(c) not in fallback_ids]
    return primary or fits or [min(configs, key=lambda c: estimate(c, element_size))]


def shared_memory_pruner(estimate, tensor_arg: str, fallback=()):
    """An autotuner's ``early_config_prune``: ``fitting_configs`` for the element size of the
    kernel's argument ``tensor_arg`` (a tensor, or a host tensor descriptor's) on its device."""

    def prune(configs, named_args, **kwargs):
        t = getattr(named_args[tensor_arg], "base", named_args[tensor_arg])
        index = t.device.index if t.device.type == "cuda" else None
        return fitting_configs(configs, t.element_size(), estimate, fallback, index)

    return prune


# The autotuning keys: every argument that changes the best tiles or the compiled code.
FORWARD_KEY = ["T", "D_FF", "N_OUT", "D_IN", "SAVE_PREACT", "DOT_PRECISION"]
HIDDEN_KEY = [
    "T",
    "D_FF",
    "N_OUT",
    "D_IN",
    "RECOMPUTE_A",
    "WRITE_A",
    "HAS_DY",
    "WRITE_H",
    "DW2_PARTIALS",
    "DOT_PRECISION",
]


# The token count T is bucketed to powers of two in the tables and across calls (a new T in a tuned
# bucket reuses its pick); the model dims stay exact.
T_BUCKETS = {"T": tuning_tables.pow2_bucket}


def _autotuned(kernel, key, smem_estimate, tiles, name: str, phase: str):
    """``kernel`` behind an autotuner of its own over ``tiles`` (``tile_configs``' tuples), keyed on
    ``key``, pruned by ``smem_estimate``, registered with the config tables as ``name``."""
    return tuning_tables.autotune(
        tile_configs(tiles),
        name=name,
        phase=phase,
        key=key,
        dtype_arg="x_ptr",
        buckets=T_BUCKETS,
        prune_configs_by={"early_config_prune": shared_memory_pruner(smem_estimate, "x_ptr")},
    )(kernel)


def autotuned_forward(tiles, name: str, phase: str):
    """``fused_mlp_fwd_kernel`` behind an autotuner of its own over ``tiles`` (``tile_configs``'
    tuples), pruned by shared memory, registered with the config tables as ``name``."""
    return _autotuned(fused_mlp_fwd_kernel, FORWARD_KEY, register_forward_smem, tiles, name, phase)


def autotuned_hidden(tiles, name: str, phase: str):
    """``mlp_hidden_kernel`` behind an autotuner of its own over ``tiles``, pruned by shared memory,
    registered with the config tables as ``name``."""
    return _autotuned(mlp_hidden_kernel, HIDDEN_KEY, hidden_kernel_smem, tiles, name, phase)


# --- host helpers ---------------------------------------------------------------------------------


def pad_hidden(w1: Tensor, w2: Tensor) -> tuple[Tensor, Tensor]:
    """w1 (..., D_FF, D_IN) and w2 (..., N_OUT, D_FF) with D_FF zero-padded to a multiple of 16.

    A row of d_ff = 1365 bf16 values is 2730 bytes: not 16-byte aligned, so neither Triton's vector
    loads nor cuBLAS's fast kernels can read it (cuBLAS: 726 µs for x W1ᵀ at T = 44 000 with 1365
    rows, 98 µs with 1376, H200). Zero rows of W1 and zero columns of W2 give a = 0 there, silu(0) = 0,
    and add nothing to y; autograd slices their gradients back.
    """
    pad = -w1.shape[-2] % 16
    if pad == 0:
        return w1, w2
    return torch.nn.functional.pad(w1, (0, 0, 0, pad)), torch.nn.functional.pad(w2, (0, pad))


def aligned_empty(rows: int, cols: int, like: Tensor) -> Tensor:
    """An uninitialised (rows, cols) view whose row stride is a multiple of 16 elements.

    cuBLAS runs its fast tensor-core GEMMs only on 16-byte-aligned leading dimensions: a (T, 1365)
    matrix with rows 1376 apart costs 0.8% more memory and keeps the backward's GEMMs (and Triton's
    vector loads and stores) on the fast path.
    """
    stride = cdiv(cols, 16) * 16
    return torch.empty((rows, stride), dtype=like.dtype, device=like.device)[:, :cols]


def compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype the kernels compute in: autocast's, when it is on (as F.linear would), else x's."""
    return autocast_dtype(x) or x.dtype


def check_weights_dtype(names: tuple[str, str, str], x: Tensor, w1: Tensor, w2: Tensor) -> torch.dtype:
    """The compute dtype; outside autocast the three tensors must share it."""
    if not torch.is_autocast_enabled(x.device.type) and not (x.dtype == w1.dtype == w2.dtype):
        raise ValueError(
            f"dtypes: {names[0]} {x.dtype}, {names[1]} {w1.dtype} and {names[2]} {w2.dtype} "
            "must match outside autocast"
        )
    return compute_dtype(x)


def check_mlp_tensors(names: tuple[str, str, str], *tensors: Tensor) -> None:
    for name, t in zip(names, tensors, strict=True):
        check_tensor(name, t, SUPPORTED_DTYPES)


def check_model_dim(name: str, rows: int, d_in: int, widest_row: int) -> None:
    """A model dim the tensor-core dot takes, at least one row, and 32-bit offsets that reach."""
    if d_in % 16:
        raise ValueError(
            f"{name}: the model dim must be a multiple of 16 for the tensor-core dot, got {d_in}"
        )
    if rows < 1:
        raise ValueError(f"{name}: expected at least one row (token), got {rows}")
    check_offset_range(name, rows, widest_row)
