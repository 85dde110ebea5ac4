"""The MLP y = silu(x W1ᵀ) W2ᵀ as Triton kernels: one-kernel forwards, and SiLU's backward.

Shapes follow nn.Linear: x (T, D_IN), w1 (D_FF, D_IN), w2 (N_OUT, D_FF).

d_ff = 1365 is not a multiple of 16, and a row of 1365 bf16 values is 2730 bytes: not 16-byte
aligned, so neither Triton's vector loads nor cuBLAS's fast kernels can read W2's rows or the
(T, 1365) activations. ``pad_hidden`` therefore pads D_FF to 1376 with zero rows of W1 and zero
columns of W2 on every call (2.8 MB of copies; autograd slices their gradients back): a = 0 there,
silu(0) = 0, and the padding adds nothing to y. Measured on the H200 (README, note 6): cuBLAS takes
726 µs for x W1ᵀ at T = 44 000 with 1365 rows, 98 µs with 1376.

Two one-kernel forwards, the same arithmetic in a different place for the hidden layer:
- **Hidden layer in registers** (``fused_mlp_fwd_kernel``): a program owns BLOCK_M rows and
  BLOCK_N output columns and walks the hidden dimension in chunks; for each chunk it computes
  a = x W1ᵀ, applies SiLU and multiplies by the matching slice of W2 at once, accumulating y in
  registers. The hidden activation never leaves the SM. The catch is the accumulator: a 512-wide
  output row block fills the register file at 64 rows, so the products run on small tiles with
  nothing left to hide load latency (README, session 4). Phase 07 runs its 10 mixture heads
  (N_OUT = 3 each: no such catch) through this kernel, with the group axis
  (w1 (G, D_FF, D_IN), w2 (G, N_OUT, D_FF), one output slice per group).
- **Hidden layer staged in L2** (``fused_mlp_staged_kernel``, the default): a persistent program
  takes a block of 128 rows, computes its whole hidden row block h = silu(x W1ᵀ) tile by tile into
  a scratch buffer of its own (128 × D_FF, 352 KB in bf16, 46 MB for all programs on an H100:
  sized for its 50 MB L2), then multiplies it by W2ᵀ, and takes its next row block. Both products
  run on 128 × 256 tiles, as a plain GEMM would, in one launch.

Every kernel here computes SiLU's sigmoid with one tanh.approx a value for 16-bit outputs
(``_sigmoid``).

Backward: a (saved, or recomputed by cuBLAS) and dh = dy W2 (cuBLAS) meet in one elementwise
Triton kernel that writes da = dh · silu'(a) and h; dx = da W1, dW1 = daᵀ x and dW2 = dyᵀ h are
cuBLAS GEMMs. (``mlp_hidden_kernel`` below fuses dh = dy W2 with that epilogue, which phase 07's
3-wide heads want; at N_OUT = 512 its tiles run slower than cuBLAS's GEMM and the separate pass:
README, session 5.)
"""

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

import common  # the package imports it first: without a GPU it selects the interpreter
from common.launch import check_offset_range, tma_ok

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


# sigmoid(a) = ½ + ½·tanh(a/2), with PTX's tanh.approx.f32: one special-function instruction a
# value where the exact sigmoid's exponential and reciprocal take two. Over a 128 × 256 tile that
# unit was the staged forward's bottleneck (README, session 5). Its error, about 2^-11 relative, is
# below bf16 and fp16 rounding, so 16-bit outputs use it; fp32, and the interpreter (no inline
# PTX), keep the exact sigmoid.
FAST_TANH = tl.constexpr(common.ON_GPU)


@triton.jit
def _sigmoid(a, out_dtype: tl.constexpr):
    """sigmoid of an fp32 tile whose results end up rounded to out_dtype."""
    if FAST_TANH and out_dtype != tl.float32:
        tanh = tl.inline_asm_elementwise(
            "tanh.approx.f32 $0, $1;", "=r,r", [0.5 * a], dtype=tl.float32, is_pure=True, pack=1
        )
        return 0.5 + 0.5 * tanh
    else:
        return tl.sigmoid(a)


@triton.jit
def _silu_and_grad(a, out_dtype: tl.constexpr):
    """silu(a) and its derivative s·(1 + a·(1 - s)), s = sigmoid(a); fp32 in and out."""
    s = _sigmoid(a, out_dtype)
    return a * s, s * (1.0 + a * (1.0 - s))


@triton.jit
def _preactivation(
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
        acc = tl.dot(x, w1t, acc)
    return acc


@triton.jit
def fused_mlp_fwd_kernel(
    x_ptr,
    w1_ptr,
    w2_ptr,
    y_ptr,
    a_ptr,
    T,
    D_FF,
    N_OUT,
    stride_xt,
    stride_xk,
    stride_w1g,
    stride_w1f,
    stride_w1k,
    stride_w2g,
    stride_w2n,
    stride_w2f,
    stride_yt,
    stride_yg,
    stride_yn,
    stride_at,
    stride_ag,
    stride_af,
    D_IN: tl.constexpr,
    SAVE_PREACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_F: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m, pid_n, group = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w1_ptr += group * stride_w1g
    w2_ptr += group * stride_w2g
    dtype = x_ptr.dtype.element_ty
    acc_y = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for f0 in range(0, D_FF, BLOCK_F):
        offs_f = f0 + tl.arange(0, BLOCK_F)
        a = _preactivation(
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
            D_IN,
            BLOCK_M,
            BLOCK_F,
            BLOCK_K,
        ).to(dtype)
        # Rounded to the input dtype as eager's GEMM output is, so a saved `a` and this h agree.
        if SAVE_PREACT and pid_n == 0:
            tl.store(
                a_ptr + group * stride_ag + offs_m[:, None] * stride_at + offs_f[None, :] * stride_af,
                a,
                mask=(offs_m < T)[:, None] & (offs_f < D_FF)[None, :],
            )
        h, _ = _silu_and_grad(a.to(tl.float32), dtype)
        w2t = tl.load(
            w2_ptr + offs_f[:, None] * stride_w2f + offs_n[None, :] * stride_w2n,
            mask=(offs_f < D_FF)[:, None] & (offs_n < N_OUT)[None, :],
            other=0.0,
        )
        acc_y = tl.dot(h.to(dtype), w2t, acc_y)
    tl.store(
        y_ptr + offs_m[:, None] * stride_yt + group * stride_yg + offs_n[None, :] * stride_yn,
        acc_y.to(y_ptr.dtype.element_ty),
        mask=(offs_m < T)[:, None] & (offs_n < N_OUT)[None, :],
    )


@triton.jit
def fused_mlp_staged_kernel(
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
                acc = tl.dot(x_desc.load([m0, k0]), w1_desc.load([f0, k0]).T, acc)
            # Rounded to the input dtype as eager's GEMM output is, so a saved `a` and this h agree.
            a = acc.to(dtype)
            in_f = (offs_f < D_FF)[None, :]
            if SAVE_PREACT:
                tl.store(
                    a_ptr + offs_m[:, None] * stride_at + offs_f[None, :],
                    a,
                    mask=(offs_m < T)[:, None] & in_f,
                )
            h, _ = _silu_and_grad(a.to(tl.float32), dtype)
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
                acc_y = tl.dot(h, w2_desc.load([n0, f0]).T, acc_y)
            tl.store(
                y_ptr + offs_m[:, None] * stride_yt + offs_n[None, :],
                acc_y.to(dtype),
                mask=(offs_m < T)[:, None] & (offs_n < N_OUT)[None, :],
            )
        # ...and all reads done before the next row block overwrites the scratch.
        tl.debug_barrier()


@triton.jit
def silu_backward_kernel(a_ptr, dh_ptr, h_ptr, da_ptr, n, BLOCK: tl.constexpr):
    """h = silu(a) and da = dh · silu'(a) over n contiguous values; h and da may alias a and dh."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    h, dsilu = _silu_and_grad(tl.load(a_ptr + offs, mask=mask).to(tl.float32), h_ptr.dtype.element_ty)
    dh = tl.load(dh_ptr + offs, mask=mask).to(tl.float32)
    tl.store(h_ptr + offs, h.to(h_ptr.dtype.element_ty), mask=mask)
    tl.store(da_ptr + offs, (dh * dsilu).to(da_ptr.dtype.element_ty), mask=mask)


@triton.jit
def mlp_hidden_kernel(
    x_ptr,
    w1_ptr,
    w2_ptr,
    a_ptr,
    dy_ptr,
    da_ptr,
    h_ptr,
    dw2_partial_ptr,
    T,
    D_FF,
    N_OUT,
    stride_xt,
    stride_xk,
    stride_w1g,
    stride_w1f,
    stride_w1k,
    stride_w2g,
    stride_w2n,
    stride_w2f,
    stride_at,
    stride_ag,
    stride_af,
    stride_dyt,
    stride_dyg,
    stride_dyn,
    stride_pm,
    stride_pg,
    stride_pn,
    D_IN: tl.constexpr,
    RECOMPUTE_A: tl.constexpr,
    WRITE_A: tl.constexpr,
    HAS_DY: tl.constexpr,
    WRITE_H: tl.constexpr,
    DW2_PARTIALS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_F: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
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
        a = _preactivation(
            x_ptr,
            w1_ptr + group * stride_w1g,
            offs_m,
            offs_f,
            T,
            D_FF,
            stride_xt,
            stride_xk,
            stride_w1f,
            stride_w1k,
            D_IN,
            BLOCK_M,
            BLOCK_F,
            BLOCK_K,
        ).to(dtype)
        if WRITE_A:
            tl.store(a_ptr + hidden_offsets, a, mask=mask_mf)
    else:
        a = tl.load(a_ptr + hidden_offsets, mask=mask_mf, other=0.0)
    h, dsilu = _silu_and_grad(a.to(tl.float32), dtype)
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
            dh = tl.dot(dy, w2, dh)
            if DW2_PARTIALS:  # this block's dyᵀ h; N_OUT <= BLOCK_N, so once per tile
                part = tl.dot(tl.trans(dy), h.to(dtype))
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


def _configs(gpu: list[tuple], cpu: tuple) -> list[triton.Config]:
    """(BLOCK_M, BLOCK_N, BLOCK_F, BLOCK_K, warps, stages) tuples as autotuner configs; the interpreter
    gets one config (it cannot time, and one is all a correctness check needs)."""
    names = ("BLOCK_M", "BLOCK_N", "BLOCK_F", "BLOCK_K")
    chosen = gpu if common.ON_GPU else [cpu]
    return [
        triton.Config(dict(zip(names, c[:4], strict=True)), num_warps=c[4], num_stages=c[5]) for c in chosen
    ]


# A 512-wide output accumulator per program holds BLOCK_M·512 fp32 in registers: at BLOCK_M = 64 and
# 8 warps that is 128 registers a thread. Splitting the output in two halves the registers and
# doubles the first GEMM. The autotuner measures both.
FWD_CONFIGS = _configs(
    gpu=[(64, 256, 64, 64, 8, 3), (128, 256, 64, 64, 8, 3), (64, 512, 64, 64, 8, 3), (64, 512, 32, 64, 8, 3)],
    cpu=(64, 128, 128, 256, 4, 1),
)
# The forward's mode of the hidden kernel (GEMM + SiLU, writing a and h): the best of a sweep of 20
# tiles at T = 44 000 was 128 x 128 / 8 warps (README, session 3).
HIDDEN_CONFIGS = _configs(
    gpu=[(128, 64, 128, 64, 8, 3), (64, 64, 128, 64, 4, 3), (128, 64, 256, 64, 8, 3)],
    cpu=(64, 128, 128, 256, 4, 1),
)
# The staged forward: every program takes 128 rows (its scratch is sized by it). Tiles
# (BLOCK_F, BLOCK_K, BLOCK_N, BLOCK_FK, warps, pipeline stages of phase 1 and of phase 2): the four
# fastest of a probe at T = 44 000 and 205 000 (README, session 5).
STAGED_BLOCK_M = 128 if common.ON_GPU else 16


def _set_tma_blocks(nargs: dict) -> None:
    """A config's tile shapes, given to the TMA descriptors before it launches (autotuning included)."""
    nargs["x_desc"].block_shape = [STAGED_BLOCK_M, nargs["BLOCK_K"]]
    nargs["w1_desc"].block_shape = [nargs["BLOCK_F"], nargs["BLOCK_K"]]
    nargs["w2_desc"].block_shape = [nargs["BLOCK_N"], nargs["BLOCK_FK"]]


STAGED_CONFIGS = [
    triton.Config(
        {"BLOCK_F": f, "BLOCK_K": k, "BLOCK_N": n, "BLOCK_FK": fk, "STAGES_1": s1, "STAGES_2": s2},
        num_warps=warps,
        pre_hook=_set_tma_blocks,
    )
    for f, k, n, fk, warps, s1, s2 in (
        [
            (256, 64, 256, 64, 8, 3, 3),
            (256, 64, 256, 64, 8, 4, 4),
            (128, 64, 256, 64, 8, 4, 3),
            (128, 128, 256, 64, 8, 3, 3),
        ]
        if common.ON_GPU
        else [(32, 32, 32, 32, 1, 1, 1)]
    )
]


fused_mlp_fwd = triton.autotune(FWD_CONFIGS, key=["T", "D_FF", "N_OUT", "D_IN", "SAVE_PREACT"])(
    fused_mlp_fwd_kernel
)
fused_mlp_staged = triton.autotune(STAGED_CONFIGS, key=["T", "D_FF", "N_OUT", "D_IN", "SAVE_PREACT"])(
    fused_mlp_staged_kernel
)
mlp_hidden = triton.autotune(
    HIDDEN_CONFIGS,
    key=["T", "D_FF", "N_OUT", "D_IN", "RECOMPUTE_A", "WRITE_A", "HAS_DY", "WRITE_H", "DW2_PARTIALS"],
)(mlp_hidden_kernel)


# --- the autograd functions --------------------------------------------------------------------


def pad_hidden(w1: Tensor, w2: Tensor) -> tuple[Tensor, Tensor]:
    """w1 (..., D_FF, D_IN) and w2 (..., N_OUT, D_FF) with D_FF zero-padded to a multiple of 16."""
    pad = -w1.shape[-2] % 16
    if pad == 0:
        return w1, w2
    return torch.nn.functional.pad(w1, (0, 0, 0, pad)), torch.nn.functional.pad(w2, (0, pad))


def aligned_empty(rows: int, cols: int, like: Tensor) -> Tensor:
    """An uninitialised (rows, cols) view whose row stride is a multiple of 16 elements.

    cuBLAS runs its fast tensor-core GEMMs only on 16-byte-aligned leading dimensions, and a row of
    d_ff = 1365 bf16 values is 2730 bytes: a (T, 1365) matrix with rows 1376 apart costs 0.8% more
    memory and keeps the backward's GEMMs (and Triton's vector loads and stores) on the fast path.
    """
    stride = triton.cdiv(cols, 16) * 16
    return torch.empty((rows, stride), dtype=like.dtype, device=like.device)[:, :cols]


def _forward_in_registers(x: Tensor, w1: Tensor, w2: Tensor, a: Tensor | None) -> Tensor:
    """y from ``fused_mlp_fwd_kernel``, writing the pre-activation into ``a`` if one is given."""
    T, D_IN = x.shape
    D_FF, N_OUT = w1.shape[0], w2.shape[0]
    y = torch.empty((T, N_OUT), dtype=x.dtype, device=x.device)
    a_strides = (a.stride(0), 0, a.stride(1)) if a is not None else (0, 0, 0)

    def grid(meta):
        return triton.cdiv(T, meta["BLOCK_M"]), triton.cdiv(N_OUT, meta["BLOCK_N"]), 1

    fused_mlp_fwd[grid](
        x,
        w1,
        w2,
        y,
        a,
        T,
        D_FF,
        N_OUT,
        *x.stride(),
        0,
        *w1.stride(),
        0,
        *w2.stride(),
        y.stride(0),
        0,
        y.stride(1),
        *a_strides,
        D_IN=D_IN,
        SAVE_PREACT=a is not None,
    )
    return y


def _tma_ready(t: Tensor) -> Tensor:
    """t itself if a TMA descriptor can address it, else a fresh dense copy (``contiguous()`` would
    return a misaligned dense view as is)."""
    return t if tma_ok(t) else t.clone(memory_format=torch.contiguous_format)


def _forward_staged(x: Tensor, w1: Tensor, w2: Tensor, a: Tensor | None) -> Tensor:
    """y from ``fused_mlp_staged_kernel``: one program per SM (at most one per row block), each with
    a scratch of STAGED_BLOCK_M hidden rows; writes the pre-activation into ``a`` if one is given."""
    x, w1, w2 = _tma_ready(x), _tma_ready(w1), _tma_ready(w2)
    T, D_IN = x.shape
    D_FF, N_OUT = w1.shape[0], w2.shape[0]
    # In the interpreter: a few programs, each taking several row blocks.
    most = common.sm_count(x.device) if x.is_cuda else 4
    n_programs = min(triton.cdiv(T, STAGED_BLOCK_M), most)
    scratch = aligned_empty(n_programs * STAGED_BLOCK_M, D_FF, x)
    y = torch.empty((T, N_OUT), dtype=x.dtype, device=x.device)
    # Block shapes are placeholders: each config's pre_hook sets its own.
    descriptors = [TensorDescriptor.from_tensor(t, [16, 16]) for t in (x, w1, w2)]
    fused_mlp_staged[(n_programs,)](
        *descriptors,
        y,
        a,
        scratch,
        T,
        D_FF,
        N_OUT,
        y.stride(0),
        a.stride(0) if a is not None else 0,
        scratch.stride(0),
        D_IN=D_IN,
        SAVE_PREACT=a is not None,
        BLOCK_M=STAGED_BLOCK_M,
    )
    return y


SILU_BLOCK = 4096  # values a program of the elementwise SiLU backward takes


def _hidden_grads(x: Tensor, w1: Tensor, w2: Tensor, a: Tensor | None, dy: Tensor) -> tuple[Tensor, Tensor]:
    """da = (dy W2) · silu'(a) and h = silu(a), with a saved or recomputed as x W1ᵀ.

    The two products go to cuBLAS; the elementwise step is one Triton pass that writes da over
    dh and, when a was recomputed here, h over a (a saved a stays intact: autograd may backpropagate
    through the same graph again)."""
    recomputed = a is None
    a = x @ w1.t() if recomputed else a
    dh = dy @ w2
    h = a if recomputed else torch.empty_like(a)
    n = a.numel()
    assert a.is_contiguous() and dh.is_contiguous(), "D_FF is padded to a multiple of 16: rows are dense"
    silu_backward_kernel[(triton.cdiv(n, SILU_BLOCK),)](a, dh, h, dh, n, BLOCK=SILU_BLOCK, num_warps=8)
    return dh, h


def _weight_grads_and_dx(x, w1, dy, da, h):
    """dx = da W1, dW1 = daᵀ x, dW2 = dyᵀ h, on cuBLAS. dW2 is computed as (hᵀ dy)ᵀ, so the GEMM writes
    a (D_FF, N_OUT) matrix with aligned rows; the gradient is its transposed view."""
    return da @ w1, da.t() @ x, (h.t() @ dy).t()


def _mlp_backward(ctx, dy: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """dx, dW1, dW2 from what either forward saved: x, W1, W2 and a (or None, to recompute it)."""
    x, w1, w2, a = ctx.saved_tensors
    dy = dy.contiguous()
    da, h = _hidden_grads(x, w1, w2, a, dy)
    return _weight_grads_and_dx(x, w1, dy, da, h)


class _FusedMLP(torch.autograd.Function):
    """One-kernel forward (staged in L2, or in registers); the backward keeps a or recomputes it."""

    @staticmethod
    def forward(
        ctx, x: Tensor, w1: Tensor, w2: Tensor, save_preactivation: bool, in_registers: bool
    ) -> Tensor:
        a = aligned_empty(x.shape[0], w1.shape[0], x) if save_preactivation else None
        y = (_forward_in_registers if in_registers else _forward_staged)(x, w1, w2, a)
        ctx.save_for_backward(x, w1, w2, a)
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        return *_mlp_backward(ctx, dy), None, None


class _GemmSiluThenCublas(torch.autograd.Function):
    """The two-kernel alternative: a Triton GEMM with a SiLU epilogue writes a and h, cuBLAS does h W2ᵀ."""

    @staticmethod
    def forward(ctx, x: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
        T, D_IN = x.shape
        D_FF = w1.shape[0]
        a, h = aligned_empty(T, D_FF, x), aligned_empty(T, D_FF, x)

        def grid(meta):
            return triton.cdiv(T, meta["BLOCK_M"]), triton.cdiv(D_FF, meta["BLOCK_F"]), 1

        # The hidden kernel's forward mode: a = x W1ᵀ and h = silu(a), written side by side.
        mlp_hidden[grid](
            x,
            w1,
            w2,
            a,
            None,
            None,
            h,
            None,
            T,
            D_FF,
            w2.shape[0],
            *x.stride(),
            0,
            *w1.stride(),
            0,
            *w2.stride(),
            a.stride(0),
            0,
            a.stride(1),
            *(0,) * 6,
            D_IN=D_IN,
            RECOMPUTE_A=True,
            WRITE_A=True,
            HAS_DY=False,
            WRITE_H=True,
            DW2_PARTIALS=False,
        )
        ctx.save_for_backward(x, w1, w2, a)
        return h @ w2.t()

    @staticmethod
    def backward(ctx, dy: Tensor):
        return _mlp_backward(ctx, dy)


# --- the public functions ----------------------------------------------------------------------


def compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype the kernels compute in: autocast's, when it is on (as F.linear would), else x's."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def check_mlp_inputs(x: Tensor, w1: Tensor, w2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Validate x (..., D_IN), w1 (D_FF, D_IN), w2 (N_OUT, D_FF); return them flattened to 2-D and cast
    to the compute dtype (under autocast fp32 weights become bf16; the cast is differentiable)."""
    for name, t in (("x", x), ("w1", w1), ("w2", w2)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name}: expected a tensor, got {type(t).__name__}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{name}: dtype must be one of bfloat16, float16, float32, got {t.dtype}")
        if t.device.type != common.DEVICE.type:
            raise ValueError(f"{name}: must be on the {common.DEVICE.type} device, got {t.device}")
    if x.dim() < 1 or w1.dim() != 2 or w2.dim() != 2:
        raise ValueError(
            f"shapes: expected x (..., D_IN), w1 (D_FF, D_IN), w2 (N_OUT, D_FF); got x "
            f"{tuple(x.shape)}, w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)}"
        )
    if w1.shape[1] != x.shape[-1]:
        raise ValueError(f"w1: expected (D_FF, {x.shape[-1]}) to match x's last dim, got {tuple(w1.shape)}")
    if w2.shape[1] != w1.shape[0]:
        raise ValueError(f"w2: expected (N_OUT, {w1.shape[0]}) to match w1's D_FF, got {tuple(w2.shape)}")
    if x.shape[-1] % 16:
        raise ValueError(
            f"x: the model dim must be a multiple of 16 for the tensor-core dot, got {x.shape[-1]}"
        )
    if x.numel() == 0:
        raise ValueError(f"x: expected at least one token, got shape {tuple(x.shape)}")
    check_offset_range(
        "x", x.numel() // x.shape[-1], max(x.shape[-1], -(-w1.shape[0] // 16) * 16, w2.shape[0])
    )
    dtype = compute_dtype(x)
    if not torch.is_autocast_enabled(x.device.type) and not (x.dtype == w1.dtype == w2.dtype):
        raise ValueError(f"dtypes: x {x.dtype}, w1 {w1.dtype} and w2 {w2.dtype} must match outside autocast")
    return x.reshape(-1, x.shape[-1]).to(dtype), w1.to(dtype), w2.to(dtype)


def fused_mlp(x: Tensor, w1: Tensor, w2: Tensor, *, save_preactivation: bool = False) -> Tensor:
    """silu(x W1ᵀ) W2ᵀ with the forward in one Triton kernel; drop-in for phase 01's `mlp_eager`.

    The forward is ``fused_mlp_staged_kernel`` (each row block's hidden layer staged in L2). By
    default nothing is saved beyond the inputs, and the backward recomputes a = x W1ᵀ: it keeps
    3.5× less memory for the backward than saving a, for one more GEMM there (README, sessions
    4-5). save_preactivation=True keeps a (T·D_FF values) instead.
    """
    x2, w1, w2 = check_mlp_inputs(x, w1, w2)
    y = _FusedMLP.apply(x2, *pad_hidden(w1, w2), save_preactivation, False)
    return y.reshape(*x.shape[:-1], w2.shape[0])


def fused_mlp_in_registers(x: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    """The same MLP with ``fused_mlp_fwd_kernel`` as the forward (the hidden layer never leaves the
    registers); kept to measure against the staged forward. Saves nothing, as ``fused_mlp``."""
    x2, w1, w2 = check_mlp_inputs(x, w1, w2)
    y = _FusedMLP.apply(x2, *pad_hidden(w1, w2), False, True)
    return y.reshape(*x.shape[:-1], w2.shape[0])


def gemm_silu_mlp(x: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    """The same MLP with a two-kernel forward: Triton GEMM+SiLU, then cuBLAS; same backward as fused_mlp."""
    x2, w1, w2 = check_mlp_inputs(x, w1, w2)
    return _GemmSiluThenCublas.apply(x2, *pad_hidden(w1, w2)).reshape(*x.shape[:-1], w2.shape[0])


def padded_cublas_mlp(x: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    """The eager MLP (two cuBLAS GEMMs and PyTorch's SiLU) on weights padded by ``pad_hidden``:
    what padding alone buys, with no Triton kernel. Autograd saves a and h, as in eager."""
    x2, w1, w2 = check_mlp_inputs(x, w1, w2)
    w1, w2 = pad_hidden(w1, w2)
    y = torch.nn.functional.silu(x2 @ w1.t()) @ w2.t()
    return y.reshape(*x.shape[:-1], w2.shape[0])
