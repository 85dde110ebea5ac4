"""The K mixture heads as one grouped kernel: z (T, D) -> K × (D -> F -> N_OUT) -> (T, K, N_OUT).

Each head k is an MLP out_k = silu(z W1_kᵀ) W2_kᵀ with w1 (K, F, D), w2 (K, N_OUT, F); the
TransformerNP has K = 10 heads of 512 -> 1365 -> 3. Stacked, the first layers are one
(T × D) · (D × K·F) GEMM; each head's second layer reads only its own F hidden units, so the second
layer is block-diagonal and tiny (3 outputs a head). That is ``tritonlab.mlp``'s register-resident
forward with a group axis (``tritonlab._gemm.fused_mlp_fwd_kernel``, grid (row blocks, 1, heads)):
a program owns BLOCK_M rows of one head, walks the head's hidden units in chunks -- GEMM, SiLU, and
the chunk's contribution to the 3 outputs (padded to the 16 a tensor-core dot needs, by masking) in
the same registers -- and writes 3 numbers a row. By default the (T, K·F) hidden layer never reaches
memory: at T = 32 000 in bf16 that is 874 MB not written and not read back (``save_preactivation``
trades them for the backward's recomputation). F is padded to a multiple of 16 per head
(``tritonlab.mlp.pad_hidden``), so every row the kernels and cuBLAS read is 16-byte aligned.

Backward, with r the row block:

    a = z W1_kᵀ (recomputed per tile, or loaded),  dh = dy_k W2_k  (a K = 3 product),
    da = dh · silu'(a),  dW2_k = Σ_r dy_kᵀ h  (per-row-block partials, summed in a fixed order),
    dz = da W1 (stacked),  dW1 = daᵀ z  (two cuBLAS GEMMs on the stacked (T, K·F) da)

so h is never written (``tritonlab._gemm.mlp_hidden_kernel``).

**torch.compile.** Dynamo cannot trace the autotuned launches, so while it traces, ``gmm_heads``
calls the custom op ``tritonlab::gmm_heads_forward`` -- (out, the kept pre-activation or an empty
tensor), with a fake implementation giving their shapes and strides -- whose registered autograd
formula calls ``tritonlab::gmm_heads_backward``: the same launches as the eager route, as opaque
nodes. Eager calls keep the plain autograd function, which skips the custom-op dispatcher's host
time. ``record`` cannot cross a custom op: passing one while compiling is an error.
"""

import torch
from torch import Tensor, nn

# Mostly the names mlp.py imports too: both are clients of the shared kernels and helpers in _gemm.
from ._gemm import (
    aligned_empty,
    autotuned_forward,
    autotuned_hidden,
    check_mlp_tensors,
    check_model_dim,
    check_weights_dtype,
    pad_hidden,
)
from ._runtime import INTERPRET, cdiv
from .tuning import ConfigRecord, dot_precision, refuse_record_under_compile

__all__ = ["GMMHeads", "gmm_heads", "gmm_heads_bmm"]

_N_OUT_PAD = 16  # each head has 3 outputs; a tensor-core dot needs 16, the rest is masked
# (BLOCK_M, BLOCK_N, BLOCK_F, BLOCK_K, warps, stages); the interpreter gets one config.
_FWD_TILES = [
    (128, _N_OUT_PAD, 64, 64, 4, 3),
    (128, _N_OUT_PAD, 128, 64, 8, 3),
    (64, _N_OUT_PAD, 128, 64, 4, 3),
    (128, _N_OUT_PAD, 128, 128, 8, 2),
]
# The backward writes one dW2 partial per row block, so its BLOCK_M is fixed: the caller sizes the buffer.
_BWD_BLOCK_M = 64 if INTERPRET else 128
_BWD_TILES = [
    (_BWD_BLOCK_M, _N_OUT_PAD, 64, 64, 4, 3),
    (_BWD_BLOCK_M, _N_OUT_PAD, 128, 64, 8, 3),
    (_BWD_BLOCK_M, _N_OUT_PAD, 128, 64, 4, 3),
]
_CPU_FWD_TILES = [(64, _N_OUT_PAD, 256, 256, 4, 1)]
_CPU_BWD_TILES = [(_BWD_BLOCK_M, _N_OUT_PAD, 256, 256, 4, 1)]

_heads_fwd = autotuned_forward(
    _CPU_FWD_TILES if INTERPRET else _FWD_TILES, "heads.forward", "07_grouped_gemm"
)
_heads_hidden_bwd = autotuned_hidden(
    _CPU_BWD_TILES if INTERPRET else _BWD_TILES, "heads.hidden_backward", "07_grouped_gemm"
)


def _heads_forward(
    z: Tensor, w1: Tensor, w2: Tensor, save_preactivation: bool, record
) -> tuple[Tensor, Tensor | None]:
    """(T, G, N_OUT) outputs in one launch, and the stacked pre-activation if it is to be kept."""
    T, D_IN = z.shape
    G, D_FF, _ = w1.shape
    N_OUT = w2.shape[1]
    out = torch.empty((T, G, N_OUT), dtype=z.dtype, device=z.device)
    # The stacked pre-activation (T, G·D_FF), head g's columns at g·D_FF, when it is kept.
    a = aligned_empty(T, G * D_FF, z) if save_preactivation else None
    a_strides = (a.stride(0), D_FF, 1) if a is not None else (0, 0, 0)

    def grid(meta):
        return cdiv(T, meta["BLOCK_M"]), 1, G

    _heads_fwd[grid](
        z, w1, w2, out, a, T, D_FF, N_OUT,
        *z.stride(), *w1.stride(), *w2.stride(), *out.stride(), *a_strides,
        D_IN=D_IN, SAVE_PREACT=save_preactivation, DOT_PRECISION=dot_precision(z.dtype),
    )  # fmt: skip
    if record is not None:
        record.note("heads_fwd", _heads_fwd.best_config)
    return out, a


def _heads_backward(z: Tensor, w1: Tensor, w2: Tensor, a: Tensor | None, dout: Tensor, record):
    """dz, dW1, dW2 from the forward's inputs and its pre-activation (or None, to recompute it)."""
    T, D_IN = z.shape
    G, D_FF, _ = w1.shape
    N_OUT = w2.shape[1]
    dout = dout.to(z.dtype).contiguous()
    da = aligned_empty(T, G * D_FF, z)
    n_row_blocks = cdiv(T, _BWD_BLOCK_M)
    dw2_partials = torch.empty((n_row_blocks, G, N_OUT, D_FF), dtype=torch.float32, device=z.device)

    def grid(meta):
        return n_row_blocks, cdiv(D_FF, meta["BLOCK_F"]), G

    _heads_hidden_bwd[grid](
        z, w1, w2, a, dout, da, None, dw2_partials, T, D_FF, N_OUT,
        *z.stride(), *w1.stride(), *w2.stride(), da.stride(0), D_FF, 1, *dout.stride(),
        *dw2_partials.stride()[:3],
        D_IN=D_IN, RECOMPUTE_A=a is None, WRITE_A=False, HAS_DY=True, WRITE_H=False, DW2_PARTIALS=True,
        DOT_PRECISION=dot_precision(z.dtype),
    )  # fmt: skip
    if record is not None:
        record.note("heads_hidden_bwd", _heads_hidden_bwd.best_config)
    w1_stacked = w1.reshape(G * D_FF, D_IN)
    dz = da @ w1_stacked
    dw1 = (da.t() @ z).view(G, D_FF, D_IN)
    dw2 = dw2_partials.sum(0).to(w2.dtype)  # a fixed-order sum over row blocks: deterministic
    return dz, dw1, dw2


class _GroupedHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: Tensor, w1: Tensor, w2: Tensor, save_preactivation: bool, record) -> Tensor:
        out, a = _heads_forward(z, w1, w2, save_preactivation, record)
        ctx.record = record
        ctx.save_for_backward(z, w1, w2, a)
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        return *_heads_backward(*ctx.saved_tensors, dout, ctx.record), None, None


# --- custom ops: the same launches, opaque to torch.compile ---------------------------------------


@torch.library.custom_op("tritonlab::gmm_heads_forward", mutates_args=())
def _gmm_heads_forward(z: Tensor, w1: Tensor, w2: Tensor, save_preactivation: bool) -> tuple[Tensor, Tensor]:
    """(out, a): a is the stacked pre-activation the backward reads with ``save_preactivation``, else empty."""
    out, a = _heads_forward(z, w1, w2, save_preactivation, None)
    return out, a if a is not None else z.new_empty(0)


@_gmm_heads_forward.register_fake
def _(z, w1, w2, save_preactivation):
    (T, _), (G, D_FF, _) = z.shape, w1.shape
    a = aligned_empty(T, G * D_FF, z) if save_preactivation else z.new_empty(0)
    return z.new_empty((T, G, w2.shape[1])), a


@torch.library.custom_op("tritonlab::gmm_heads_backward", mutates_args=())
def _gmm_heads_backward(
    z: Tensor, w1: Tensor, w2: Tensor, a: Tensor | None, dout: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    return _heads_backward(z, w1, w2, a, dout, None)


@_gmm_heads_backward.register_fake
def _(z, w1, w2, a, dout):
    return z.new_empty(z.shape), z.new_empty(w1.shape), z.new_empty(w2.shape)


def _setup_context(ctx, inputs, output):
    z, w1, w2, save_preactivation = inputs
    _, a = output
    ctx.mark_non_differentiable(a)
    ctx.set_materialize_grads(False)  # no zero-filled gradient for a
    ctx.save_for_backward(z, w1, w2, a if save_preactivation else None)


def _backward_formula(ctx, dout, _grad_a):
    return *_gmm_heads_backward(*ctx.saved_tensors, dout), None


_gmm_heads_forward.register_autograd(_backward_formula, setup_context=_setup_context)


def _check_heads_inputs(z: Tensor, w1: Tensor, w2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Validate z (T, D), w1 (G, F, D), w2 (G, N_OUT, F) with N_OUT <= 16; cast to the compute dtype."""
    check_mlp_tensors(("z", "w1", "w2"), z, w1, w2)
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
    if w2.shape[1] > _N_OUT_PAD:
        raise ValueError(f"w2: at most {_N_OUT_PAD} outputs per head are supported, got {w2.shape[1]}")
    check_model_dim("z", T, D, max(D, G * cdiv(F, 16) * 16))  # the (T, G·F) hidden layer
    dtype = check_weights_dtype(("z", "w1", "w2"), z, w1, w2)
    # The stacked first layer is read as one (G·F, D) matrix by the backward's cuBLAS GEMMs.
    return z.to(dtype), w1.to(dtype).contiguous(), w2.to(dtype)


def gmm_heads(
    z: Tensor, w1: Tensor, w2: Tensor, *, save_preactivation: bool = False, record: ConfigRecord | None = None
) -> Tensor:
    """K head MLPs silu(z W1_kᵀ) W2_kᵀ -> (T, K, N_OUT) in one Triton kernel; drop-in for
    ``tritonlab.models.gmm_heads_loop``. Under autocast the fp32 weights are cast to the autocast
    dtype, as F.linear does.

    By default nothing of the (T, K·F) hidden layer is kept: the backward recomputes it (one more
    GEMM of the forward's size). ``save_preactivation=True`` writes the pre-activation instead
    (T·K·F values: 880 MB at T = 32 000 in bf16) and the backward reads it. ``record`` receives the
    tiles the forward's and the backward's autotuners picked (eager calls only, not under torch.compile).
    """
    z, w1, w2 = _check_heads_inputs(z, w1, w2)
    w1, w2 = pad_hidden(w1, w2)
    if torch.compiler.is_compiling():
        refuse_record_under_compile(record, "gmm_heads")
        return _gmm_heads_forward(z, w1, w2, save_preactivation)[0]
    # Eager: the autograd function directly, without the custom op dispatcher's host time per call.
    return _GroupedHeads.apply(z, w1, w2, save_preactivation, record)


def gmm_heads_bmm(z: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    """The batched-GEMM baseline in PyTorch: a (K, T, F) hidden layer through two batched products."""
    hidden = torch.nn.functional.silu(torch.matmul(z, w1.transpose(1, 2)))  # (K, T, F)
    return torch.bmm(hidden, w2.transpose(1, 2)).permute(1, 0, 2)  # (T, K, 3)


class GMMHeads(nn.Module):
    """``gmm_heads`` with its weights: K heads d_model -> d_hidden -> n_out, no biases, each head's
    weights initialised as nn.Linear's."""

    def __init__(self, n_heads: int, d_model: int, d_hidden: int, n_out: int = 3, *, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.w1 = nn.Parameter(torch.empty(n_heads, d_hidden, d_model, **kw))
        self.w2 = nn.Parameter(torch.empty(n_heads, n_out, d_hidden, **kw))
        for w in (self.w1, self.w2):
            bound = w.shape[-1] ** -0.5  # nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
            nn.init.uniform_(w, -bound, bound)

    def forward(self, z: Tensor) -> Tensor:
        return gmm_heads(z, self.w1, self.w2)
