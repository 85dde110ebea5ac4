"""The MLP y = silu(x W1ᵀ) W2ᵀ as Triton kernels: a one-kernel forward, and the backward's hidden layer.

Shapes follow nn.Linear: x (T, D_IN), w1 (D_FF, D_IN), w2 (N_OUT, D_FF). Both kernels take an
optional group axis (w1 (G, D_FF, D_IN), w2 (G, N_OUT, D_FF), one output slice per group) so that
phase 07 runs its 10 mixture heads through the very same code.

Forward, one kernel: a program owns BLOCK_M rows and BLOCK_N output columns. It walks the hidden
dimension in chunks of BLOCK_F; for each chunk it computes the pre-activation a = x W1ᵀ (a short
GEMM over D_IN), applies SiLU in registers and immediately multiplies by the matching slice of W2,
accumulating y in registers. The hidden activation never reaches device memory, unless the caller
asks to keep the pre-activation a for the backward.

d_ff = 1365 is not a multiple of 16, and a row of 1365 bf16 values is 2730 bytes: not 16-byte
aligned, so neither Triton's vector loads nor cuBLAS's fast kernels can read W2's rows or the
(T, 1365) activations. ``pad_hidden`` therefore pads D_FF to 1376 with zero rows of W1 and zero
columns of W2 on every call (2.8 MB of copies; autograd slices their gradients back): a = 0 there,
silu(0) = 0, and the padding adds nothing to y. Measured on the H200 (README, note 6): cuBLAS takes
726 µs for x W1ᵀ at T = 44 000 with 1365 rows, 98 µs with 1376.

Backward, the hidden kernel: one GEMM-shaped pass over (rows, hidden units) that gets a (loaded, or
recomputed from x and W1), computes dh = dy W2 and writes da = dh · silu'(a) and, if asked, h; the
three weight/input gradient GEMMs that follow (dx = da W1, dW1 = daᵀ x, dW2 = dyᵀ h) are plain
matrix products and go to cuBLAS.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

import common  # the package imports it first: without a GPU it selects the interpreter
from common.launch import check_offset_range

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def _silu_and_grad(a):
    """silu(a) and its derivative s·(1 + a·(1 - s)), s = sigmoid(a); fp32 in and out."""
    s = tl.sigmoid(a)
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
        h, _ = _silu_and_grad(a.to(tl.float32))
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
    h, dsilu = _silu_and_grad(a.to(tl.float32))
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
# The last three: the fastest tiles of a sweep of 20 at T = 44 000 (README, session 3) in the
# backward's mode (dh = dy W2 with SiLU'), which the first three had left 5-10% slower.
HIDDEN_CONFIGS = _configs(
    gpu=[
        (128, 64, 128, 64, 8, 3),
        (64, 64, 128, 64, 4, 3),
        (128, 64, 256, 64, 8, 3),
        (64, 64, 256, 64, 8, 4),
        (128, 64, 64, 64, 8, 4),
        (128, 64, 256, 64, 8, 4),
    ],
    cpu=(64, 128, 128, 256, 4, 1),
)

fused_mlp_fwd = triton.autotune(FWD_CONFIGS, key=["T", "D_FF", "N_OUT", "D_IN", "SAVE_PREACT"])(
    fused_mlp_fwd_kernel
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


def _hidden_call(x, w1, w2, *, a=None, dy=None, da=None, h=None, recompute_a, write_a=False):
    """Launch the hidden kernel for an ungrouped MLP (see mlp_hidden_kernel)."""
    T, D_IN = x.shape
    D_FF, N_OUT = w1.shape[0], w2.shape[0]
    hidden = next(t for t in (da, h, a) if t is not None)
    dy_strides = (dy.stride(0), 0, dy.stride(1)) if dy is not None else (0, 0, 0)

    def grid(meta):
        return triton.cdiv(T, meta["BLOCK_M"]), triton.cdiv(D_FF, meta["BLOCK_F"]), 1

    mlp_hidden[grid](
        x,
        w1,
        w2,
        a,
        dy,
        da,
        h,
        None,
        T,
        D_FF,
        N_OUT,
        *x.stride(),
        0,
        *w1.stride(),
        0,
        *w2.stride(),
        hidden.stride(0),
        0,
        hidden.stride(1),
        *dy_strides,
        0,
        0,
        0,
        D_IN=D_IN,
        RECOMPUTE_A=recompute_a,
        WRITE_A=write_a,
        HAS_DY=dy is not None,
        WRITE_H=h is not None,
        DW2_PARTIALS=False,
    )


def aligned_empty(rows: int, cols: int, like: Tensor) -> Tensor:
    """An uninitialised (rows, cols) view whose row stride is a multiple of 16 elements.

    cuBLAS runs its fast tensor-core GEMMs only on 16-byte-aligned leading dimensions, and a row of
    d_ff = 1365 bf16 values is 2730 bytes: a (T, 1365) matrix with rows 1376 apart costs 0.8% more
    memory and keeps the backward's GEMMs (and Triton's vector loads and stores) on the fast path.
    """
    stride = triton.cdiv(cols, 16) * 16
    return torch.empty((rows, stride), dtype=like.dtype, device=like.device)[:, :cols]


def _hidden_backward(x, w1, w2, a, dy, recompute_a):
    """da and h for the backward, from the saved a or from x and W1."""
    T, D_FF = x.shape[0], w1.shape[0]
    da, h = aligned_empty(T, D_FF, x), aligned_empty(T, D_FF, x)
    _hidden_call(x, w1, w2, a=a, dy=dy, da=da, h=h, recompute_a=recompute_a)
    return da, h


def _weight_grads_and_dx(x, w1, dy, da, h):
    """dx = da W1, dW1 = daᵀ x, dW2 = dyᵀ h, on cuBLAS. dW2 is computed as (hᵀ dy)ᵀ, so the GEMM writes
    a (D_FF, N_OUT) matrix with aligned rows; the gradient is its transposed view."""
    return da @ w1, da.t() @ x, (h.t() @ dy).t()


class _FusedMLP(torch.autograd.Function):
    """One-kernel forward; the backward keeps a (save) or recomputes it inside the hidden kernel."""

    @staticmethod
    def forward(ctx, x: Tensor, w1: Tensor, w2: Tensor, save_preactivation: bool) -> Tensor:
        T, D_IN = x.shape
        D_FF, N_OUT = w1.shape[0], w2.shape[0]
        y = torch.empty((T, N_OUT), dtype=x.dtype, device=x.device)
        a = aligned_empty(T, D_FF, x) if save_preactivation else None
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
            SAVE_PREACT=save_preactivation,
        )
        ctx.save_for_backward(x, w1, w2, a)
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, w1, w2, a = ctx.saved_tensors
        dy = dy.contiguous()
        da, h = _hidden_backward(x, w1, w2, a, dy, recompute_a=a is None)
        return *_weight_grads_and_dx(x, w1, dy, da, h), None


class _GemmSiluThenCublas(torch.autograd.Function):
    """The two-kernel alternative: a Triton GEMM with a SiLU epilogue writes a and h, cuBLAS does h W2ᵀ."""

    @staticmethod
    def forward(ctx, x: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
        T, D_FF = x.shape[0], w1.shape[0]
        a, h = aligned_empty(T, D_FF, x), aligned_empty(T, D_FF, x)
        _hidden_call(x, w1, w2, a=a, h=h, recompute_a=True, write_a=True)
        ctx.save_for_backward(x, w1, w2, a)
        return h @ w2.t()

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, w1, w2, a = ctx.saved_tensors
        dy = dy.contiguous()
        da, h = _hidden_backward(x, w1, w2, a, dy, recompute_a=False)
        return _weight_grads_and_dx(x, w1, dy, da, h)


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

    By default nothing is saved beyond the inputs, and the backward's hidden kernel recomputes
    a = x W1ᵀ: measured faster than saving a (the forward's store of a costs more than the
    backward's extra GEMM: README, session 4) and 3.5× less memory kept for the backward.
    save_preactivation=True keeps a (T·D_FF values) instead.
    """
    x2, w1, w2 = check_mlp_inputs(x, w1, w2)
    y = _FusedMLP.apply(x2, *pad_hidden(w1, w2), save_preactivation)
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
