"""The K mixture heads as one grouped kernel: z (T, 512) -> 10 × (512 -> 1365 -> 3) -> (T, 10, 3).

Stacked, the first layers are one (T × 512) · (512 × 13 650) GEMM; each head's second layer reads
only its own 1365 hidden units, so the second layer is block-diagonal and tiny (3 outputs a head).
That is phase 06's fused MLP with a group axis: a program owns BLOCK_M rows of one head, walks the
head's hidden units in chunks -- GEMM, SiLU, and the chunk's contribution to the 3 outputs in the
same registers -- and writes 3 numbers a row. By default the (T, 13 650) hidden layer never reaches
memory: at T = 32 000 in bf16 that is 874 MB not written and not read back (``save_preactivation``
trades them for the backward's recomputation). d_ff is padded to 1376 per head (phase 06's
``pad_hidden``), so every row the kernels and cuBLAS read is 16-byte aligned.

Backward: the hidden kernel recomputes a = z W1ᵀ per tile, forms dh = dy_k W2_k (a K = 3 product,
padded to the 16 a tensor-core dot needs by masking) and writes da, plus this row block's share of
dW2 = dyᵀ h (so h is never written); dz = da W1 and dW1 = daᵀ z are two cuBLAS GEMMs on the
concatenated (T, 13 650) da.
"""

import importlib

import torch
import triton
from torch import Tensor

import common  # the package imports it first: without a GPU it selects the interpreter
from common.launch import check_offset_range

_mlp = importlib.import_module("phases.06_fused_mlp")
_mlp_kernel = importlib.import_module("phases.06_fused_mlp.kernel")

N_OUT_PAD = 16  # each head has 3 outputs; a tensor-core dot needs 16, the rest is masked
# (BLOCK_M, BLOCK_N, BLOCK_F, BLOCK_K, warps, stages)
HEADS_FWD_CONFIGS = _mlp_kernel._configs(
    gpu=[
        (128, N_OUT_PAD, 64, 64, 4, 3),
        (128, N_OUT_PAD, 128, 64, 8, 3),
        (64, N_OUT_PAD, 128, 64, 4, 3),
        (128, N_OUT_PAD, 128, 128, 8, 2),
    ],
    cpu=(64, N_OUT_PAD, 256, 256, 4, 1),
)
# The backward writes one dW2 partial per row block, so its BLOCK_M is fixed: the caller sizes the buffer.
BWD_BLOCK_M = 128 if common.ON_GPU else 64
HEADS_BWD_CONFIGS = _mlp_kernel._configs(
    gpu=[
        (BWD_BLOCK_M, N_OUT_PAD, 64, 64, 4, 3),
        (BWD_BLOCK_M, N_OUT_PAD, 128, 64, 8, 3),
        (BWD_BLOCK_M, N_OUT_PAD, 128, 64, 4, 3),
    ],
    cpu=(BWD_BLOCK_M, N_OUT_PAD, 256, 256, 4, 1),
)

heads_fwd = triton.autotune(HEADS_FWD_CONFIGS, key=["T", "D_FF", "N_OUT", "D_IN", "SAVE_PREACT"])(
    _mlp.fused_mlp_fwd_kernel
)
heads_hidden_bwd = triton.autotune(
    HEADS_BWD_CONFIGS,
    key=["T", "D_FF", "N_OUT", "D_IN", "RECOMPUTE_A", "WRITE_A", "HAS_DY", "WRITE_H", "DW2_PARTIALS"],
)(_mlp.mlp_hidden_kernel)


class _GroupedHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: Tensor, w1: Tensor, w2: Tensor, save_preactivation: bool) -> Tensor:
        T, D_IN = z.shape
        G, D_FF, _ = w1.shape
        N_OUT = w2.shape[1]
        out = torch.empty((T, G, N_OUT), dtype=z.dtype, device=z.device)
        # The stacked pre-activation (T, G·D_FF), head g's columns at g·D_FF, when it is kept.
        a = _mlp_kernel.aligned_empty(T, G * D_FF, z) if save_preactivation else None
        a_strides = (a.stride(0), D_FF, 1) if a is not None else (0, 0, 0)

        def grid(meta):
            return triton.cdiv(T, meta["BLOCK_M"]), 1, G

        heads_fwd[grid](
            z,
            w1,
            w2,
            out,
            a,
            T,
            D_FF,
            N_OUT,
            *z.stride(),
            *w1.stride(),
            *w2.stride(),
            *out.stride(),
            *a_strides,
            D_IN=D_IN,
            SAVE_PREACT=save_preactivation,
        )
        ctx.save_for_backward(z, w1, w2, a)
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        z, w1, w2, a = ctx.saved_tensors
        T, D_IN = z.shape
        G, D_FF, _ = w1.shape
        N_OUT = w2.shape[1]
        dout = dout.to(z.dtype).contiguous()
        da = _mlp_kernel.aligned_empty(T, G * D_FF, z)
        n_row_blocks = triton.cdiv(T, BWD_BLOCK_M)
        dw2_partials = torch.empty((n_row_blocks, G, N_OUT, D_FF), dtype=torch.float32, device=z.device)

        def grid(meta):
            return n_row_blocks, triton.cdiv(D_FF, meta["BLOCK_F"]), G

        heads_hidden_bwd[grid](
            z,
            w1,
            w2,
            a,
            dout,
            da,
            None,
            dw2_partials,
            T,
            D_FF,
            N_OUT,
            *z.stride(),
            *w1.stride(),
            *w2.stride(),
            da.stride(0),
            D_FF,
            1,
            *dout.stride(),
            *dw2_partials.stride()[:3],
            D_IN=D_IN,
            RECOMPUTE_A=a is None,
            WRITE_A=False,
            HAS_DY=True,
            WRITE_H=False,
            DW2_PARTIALS=True,
        )
        w1_stacked = w1.reshape(G * D_FF, D_IN)
        dz = da @ w1_stacked
        dw1 = (da.t() @ z).view(G, D_FF, D_IN)
        dw2 = dw2_partials.sum(0).to(w2.dtype)  # a fixed-order sum over row blocks: deterministic
        return dz, dw1, dw2, None


def check_heads_inputs(z: Tensor, w1: Tensor, w2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Validate z (T, D), w1 (G, F, D), w2 (G, N_OUT, F) with N_OUT <= 16; cast to the compute dtype."""
    for name, t in (("z", z), ("w1", w1), ("w2", w2)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name}: expected a tensor, got {type(t).__name__}")
        if t.dtype not in _mlp_kernel.SUPPORTED_DTYPES:
            raise ValueError(f"{name}: dtype must be one of bfloat16, float16, float32, got {t.dtype}")
        if t.device.type != common.DEVICE.type:
            raise ValueError(f"{name}: must be on the {common.DEVICE.type} device, got {t.device}")
    if z.dim() != 2 or w1.dim() != 3 or w2.dim() != 3:
        raise ValueError(
            f"shapes: expected z (T, D), w1 (G, F, D), w2 (G, N_OUT, F); got z {tuple(z.shape)}, "
            f"w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)}"
        )
    T, D = z.shape
    G, F, _ = w1.shape
    if w1.shape[2] != D:
        raise ValueError(f"w1: expected (G, F, {D}) to match z's last dim, got {tuple(w1.shape)}")
    if w2.shape[0] != G or w2.shape[2] != F:
        raise ValueError(f"w2: expected ({G}, N_OUT, {F}) to match w1, got {tuple(w2.shape)}")
    if w2.shape[1] > N_OUT_PAD:
        raise ValueError(f"w2: at most {N_OUT_PAD} outputs per head are supported, got {w2.shape[1]}")
    if T < 1 or D % 16:
        raise ValueError(
            f"z: expected T >= 1 rows and a model dim that is a multiple of 16, got {tuple(z.shape)}"
        )
    check_offset_range("z", T, max(D, G * (-(-F // 16) * 16)))  # the (T, G·F) hidden layer
    dtype = _mlp.compute_dtype(z)
    if not torch.is_autocast_enabled(z.device.type) and not (z.dtype == w1.dtype == w2.dtype):
        raise ValueError(f"dtypes: z {z.dtype}, w1 {w1.dtype} and w2 {w2.dtype} must match outside autocast")
    # The stacked first layer is read as one (G·F, D) matrix by the backward's cuBLAS GEMMs.
    return z.to(dtype), w1.to(dtype).contiguous(), w2.to(dtype)


def gmm_heads(z: Tensor, w1: Tensor, w2: Tensor, *, save_preactivation: bool = False) -> Tensor:
    """K head MLPs silu(z W1_kᵀ) W2_kᵀ -> (T, K, N_OUT) in one Triton kernel; drop-in for phase 01's
    `gmm_heads_loop`. Under autocast the fp32 weights are cast to the autocast dtype, as F.linear does.

    By default nothing of the (T, K·D_FF) hidden layer is kept: the backward recomputes it (one more
    GEMM of the forward's size). ``save_preactivation=True`` writes the pre-activation instead
    (T·K·D_FF values: 880 MB at T = 32 000 in bf16) and the backward reads it.
    """
    z, w1, w2 = check_heads_inputs(z, w1, w2)
    # d_ff padded to 16-byte aligned rows: see phase 06's pad_hidden.
    return _GroupedHeads.apply(z, *_mlp.pad_hidden(w1, w2), save_preactivation)


def gmm_heads_bmm(z: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    """The batched-GEMM baseline in PyTorch: (K, T, F) hidden through two torch.bmm-style products."""
    hidden = torch.nn.functional.silu(torch.matmul(z, w1.transpose(1, 2)))  # (K, T, F)
    return torch.bmm(hidden, w2.transpose(1, 2)).permute(1, 0, 2)  # (T, K, 3)
