"""The rectangular attention forward: online softmax, one program per query block.

    o = softmax(scale · q kᵀ) v,   lse = logsumexp(scale · q kᵀ)   (natural log, per query row)

for q (B, H, Lq, D) over k, v (B, H, Lk, D), no mask. A program owns BLOCK_M query rows of one
(batch, head). It keeps its Q tile in registers and streams K and V past it in BLOCK_N-row tiles,
keeping per row the running maximum ``m`` and the running sum ``l`` of exponentials (both in the
base-2 domain: scale·log2(e) is folded into one multiply, so every exponential is an ``exp2``); the
Lq x Lk score matrix never touches memory. The tile update is ``_common.online_softmax_tile``,
shared with the FlashAttention-2 forward (``flash2.py``). Only the last K tile can be partial: the
loop over full tiles runs unmasked, and the tail tile -- if Lk is not a multiple of BLOCK_N -- runs
once more with its columns masked.

On Hopper (sm_90) with 16-bit inputs, D in 64 or 128 and TMA-addressable strides, ``impl="auto"``
runs ``forward_hopper.py`` instead from Lk = GLUON_FROM_LK (1 000) keys on: the same math in Gluon,
warp-specialised (a load warp and three softmax warpgroups, one's softmax under another's
products): 1.16x / 1.19x cuDNN at phase 02's mid / large, where this kernel reaches 1.07x /
1.10x. ``impl="gluon"`` asks for it and raises where it cannot run; "tma" and "blockptr" keep this
kernel.

Two ways to load tiles, both part of the autotuning space: block pointers (``tl.make_block_ptr``,
any strides) and tensor descriptors (``tl.make_tensor_descriptor``, Hopper's TMA copy engine; needs
unit stride along D and 16-byte aligned rows, else the call falls back to block pointers). TMA wins
at long K; at one K tile per program (the small shape) building three descriptors on the device
costs more than it saves. Both also run in the interpreter.

After the first call of a signature (shapes, strides, dtypes, alignment of q, k, v) the autotuned
binary is launched directly (``tritonlab._launch``): the autotuner's and Triton's per-call binding
of 35 arguments is host time that is most of a call at the small shape.

**torch.compile.** The differentiable ``attention`` and ``fused_attention`` run this forward inside
the custom ops ``tritonlab::attention_forward`` and ``tritonlab::fused_attention_forward`` when
traced (``backward.py``); ``attention_forward`` itself, which has no backward, stays eager-only.
"""

import torch
import triton
import triton.language as tl

from .._launch import LaunchCache, autotune_for_launch, signature_key, tma_ok, use_descriptor_scratch
from .._runtime import INTERPRET, cdiv, next_power_of_2
from ..checks import check_choice
from ..tuning import ConfigRecord, dot_precision, quiet_compile_failures
from ..tuning_tables import autotune
from . import forward_hopper
from ._common import (
    LOG2E,
    check_qkv,
    config_string,
    fits,
    online_softmax_tile,
    shape_bucket,
    smallest,
    softmax_scale,
    strides4,
    tuning_bench,
)

IMPLS = ("auto", "gluon", "tma", "blockptr")
# From this many keys on, "auto" takes the Gluon kernel where it can run (_uses_gluon): measured on
# the H100 at D = 64, it ties the Triton kernel at 512 keys and is 6% faster at 1 000.
GLUON_FROM_LK = 1000


@triton.jit
def _attn_fwd_kernel(
    Q, K, V, O, LSE, qk_scale,
    stride_qb, stride_qh, stride_ql, stride_qd,
    stride_kb, stride_kh, stride_kl, stride_kd,
    stride_vb, stride_vh, stride_vl, stride_vd,
    stride_ob, stride_oh, stride_ol, stride_od,
    H, Lq, Lk,
    LQ_BUCKET, LK_BUCKET, IMPL_CHOICE,  # autotuning keys only
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_BH: tl.constexpr,
    USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    # Program order: tl.swizzle2d groups GROUP_BH heads per column of query blocks, so the
    # programs resident at one time share few K/V streams in L2 (a knob; 1 measured as good as 4).
    n_m = tl.cdiv(Lq, BLOCK_M)
    n_bh = tl.num_programs(0) // n_m
    pid = tl.program_id(0)
    pid_bh, pid_m = tl.swizzle2d(pid // n_m, pid % n_m, n_bh, n_m, GROUP_BH)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    q_base = Q + b * stride_qb + h * stride_qh
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    o_base = O + b * stride_ob + h * stride_oh
    row_start = pid_m * BLOCK_M

    if USE_TMA:
        q_desc = tl.make_tensor_descriptor(q_base, [Lq, HEAD_DIM], [stride_ql, 1], [BLOCK_M, HEAD_DIM])
        k_desc = tl.make_tensor_descriptor(k_base, [Lk, HEAD_DIM], [stride_kl, 1], [BLOCK_N, HEAD_DIM])
        v_desc = tl.make_tensor_descriptor(v_base, [Lk, HEAD_DIM], [stride_vl, 1], [BLOCK_N, HEAD_DIM])
        q = q_desc.load([row_start, 0])
    else:
        q_ptr = tl.make_block_ptr(
            q_base, (Lq, HEAD_DIM), (stride_ql, stride_qd), (row_start, 0), (BLOCK_M, HEAD_DIM), (1, 0)
        )
        # K is read transposed, (D, Lk), so the score tile is a plain Q @ K^T dot.
        kt_ptr = tl.make_block_ptr(
            k_base, (HEAD_DIM, Lk), (stride_kd, stride_kl), (0, 0), (HEAD_DIM, BLOCK_N), (0, 1)
        )
        v_ptr = tl.make_block_ptr(
            v_base, (Lk, HEAD_DIM), (stride_vl, stride_vd), (0, 0), (BLOCK_N, HEAD_DIM), (1, 0)
        )
        q = tl.load(q_ptr, boundary_check=(0,))

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    # Steady state: full K tiles, no masks, no boundary checks.
    n_full = Lk // BLOCK_N
    for j in tl.range(n_full, warp_specialize=WARP_SPECIALIZE):
        if USE_TMA:
            k_t = tl.trans(k_desc.load([j * BLOCK_N, 0]))
            v = v_desc.load([j * BLOCK_N, 0])
        else:
            k_t = tl.load(kt_ptr)
            v = tl.load(v_ptr)
            kt_ptr = tl.advance(kt_ptr, (0, BLOCK_N))
            v_ptr = tl.advance(v_ptr, (BLOCK_N, 0))
        s = tl.dot(q, k_t, input_precision=DOT_PRECISION)
        acc, m_i, l_i = online_softmax_tile(acc, m_i, l_i, s, v, qk_scale, DOT_PRECISION)
    # The tail: the one partial K tile, its missing rows read as zeros and masked to -inf.
    if n_full * BLOCK_N < Lk:
        if USE_TMA:
            k_t = tl.trans(k_desc.load([n_full * BLOCK_N, 0]))
            v = v_desc.load([n_full * BLOCK_N, 0])
        else:
            k_t = tl.load(kt_ptr, boundary_check=(1,))
            v = tl.load(v_ptr, boundary_check=(0,))
        s = tl.dot(q, k_t, input_precision=DOT_PRECISION)
        cols = n_full * BLOCK_N + tl.arange(0, BLOCK_N)
        s = tl.where((cols < Lk)[None, :], s, float("-inf"))
        acc, m_i, l_i = online_softmax_tile(acc, m_i, l_i, s, v, qk_scale, DOT_PRECISION)

    acc = acc / l_i[:, None]
    # lse in natural log of the *scaled* scores: m and l live in base 2 (scores times log2 e).
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
    rows = row_start + tl.arange(0, BLOCK_M)
    tl.store(LSE + pid_bh.to(tl.int64) * Lq + rows, lse, mask=rows < Lq)
    if USE_TMA:
        o_desc = tl.make_tensor_descriptor(o_base, [Lq, HEAD_DIM], [stride_ol, 1], [BLOCK_M, HEAD_DIM])
        o_desc.store([row_start, 0], acc.to(O.dtype.element_ty))
    else:
        o_ptr = tl.make_block_ptr(
            o_base, (Lq, HEAD_DIM), (stride_ol, stride_od), (row_start, 0), (BLOCK_M, HEAD_DIM), (1, 0)
        )
        tl.store(o_ptr, acc.to(O.dtype.element_ty), boundary_check=(0,))


# --- the launch: autotuning over tiles and loader, then direct launches --------------------------

# (BLOCK_M, BLOCK_N, num_warps, num_stages, loader). The loader is part of the search: TMA wins at
# long K, block pointers at one K tile per program. Pruned per call by element size and the GPU's
# shared memory (_prune), so float32 inputs never ask for more than the hardware has.
_SEARCH_SPACE = [
    (128, 64, 8, 3, "tma"),
    (128, 64, 4, 3, "tma"),
    (128, 64, 4, 4, "tma"),
    (128, 64, 8, 4, "tma"),
    (128, 128, 4, 3, "tma"),
    (64, 64, 4, 3, "blockptr"),
    (128, 64, 4, 3, "blockptr"),
    (128, 64, 8, 3, "blockptr"),
    # Small tiles, so that fp32 at D = 128 always has a config that fits (_prune).
    (64, 32, 4, 2, "tma"),
    (64, 32, 4, 2, "blockptr"),
]
_INTERPRETER_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 16, "GROUP_BH": 1}
_IMPL_CHOICE = {"blockptr": 0, "tma": 1, "auto": 2}
_TMA_ONLY_FROM_LK = 16_384  # beyond this, tuning time is spent on TMA configs only


def _fits(config, element_size: int, head_dim: int) -> bool:
    """Q once, K and V per pipeline stage; and fp32 or D = 128 tiles above 128 x 64 spill registers."""
    bm, bn = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]
    if element_size * head_dim > 256 and bm * bn > 128 * 64:
        return False
    return fits(element_size, head_dim, fixed_rows=bm, streamed_rows=2 * bn, stages=config.num_stages)


def _prune(configs, named_args, **kwargs):
    # The loaders the caller allows; tiles that dwarf the problem; tiles that fit the GPU.
    lk, d, choice = named_args["Lk"], kwargs.get("HEAD_DIM", 64), named_args["IMPL_CHOICE"]
    elem = named_args["Q"].element_size()
    allowed = {0: (False,), 1: (True,), 2: (True,) if lk >= _TMA_ONLY_FROM_LK else (True, False)}[choice]
    loaders = [c for c in configs if c.kwargs["USE_TMA"] in allowed]
    kept = [
        c
        for c in loaders
        if c.kwargs["BLOCK_N"] <= max(64, next_power_of_2(lk))
        and c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] >= 64 * 64  # the small tiles: only a fallback
        and _fits(c, elem, d)
    ]
    return kept or smallest([c for c in loaders if _fits(c, elem, d)] or loaders, "BLOCK_M", "BLOCK_N")


_fwd_autotuned = autotune(
    [
        triton.Config(
            {
                "BLOCK_M": bm,
                "BLOCK_N": bn,
                "GROUP_BH": 1,
                "USE_TMA": loader == "tma",
                "WARP_SPECIALIZE": False,
            },
            num_warps=w,
            num_stages=st,
        )
        for bm, bn, w, st, loader in _SEARCH_SPACE
    ],
    name="attention.forward",
    phase="02_attn_fwd",
    key=["LQ_BUCKET", "LK_BUCKET", "HEAD_DIM", "IMPL_CHOICE"],
    dtype_arg="Q",
    runs_on_sm80=lambda config: not config.kwargs["USE_TMA"],  # tensor descriptors need sm_90
    prune_configs_by={"early_config_prune": _prune},
    do_bench=tuning_bench,
)(_attn_fwd_kernel)


def _shape_args(q, k, v, o, choice: int) -> tuple:
    """The kernel's integer arguments: strides, sizes, the tuning buckets and the loader choice."""
    H, Lq, Lk = q.shape[1], q.shape[2], k.shape[2]
    strides = (*strides4(q), *strides4(k), *strides4(v), *strides4(o))
    return (*strides, H, Lq, Lk, shape_bucket(Lq), shape_bucket(Lk), choice)


def _tune(tensors: tuple, impl: str) -> tuple:
    """Autotune (or reuse the tuning of) a new call signature; what a direct launch needs: the
    compiled kernel, its grid, every argument after ``tensors`` (fixed by the signature), the config."""
    q, k, v, o = tensors[:4]
    B, H, Lq, D = q.shape
    choice = _IMPL_CHOICE[impl] if tma_ok(q, k, v, o) else _IMPL_CHOICE["blockptr"]
    meta = {"HEAD_DIM": D, "DOT_PRECISION": dot_precision(q.dtype)}
    with quiet_compile_failures("attention forward"):
        return autotune_for_launch(
            tensors,
            _fwd_autotuned,
            lambda cfg: (cdiv(Lq, cfg["BLOCK_M"]) * B * H,),
            _shape_args(q, k, v, o, choice),
            meta,
        )


# Per call signature (strides, shapes, dtypes and alignment of q, k, v; the loader; the dot
# precision, which follows torch's float32 setting): the compiled kernel the autotuner picked.
_LAUNCHES = LaunchCache(_tune)


def _forward_outputs(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty o (B, H, Lq, D), a view of a (B, Lq, H, D) buffer, and lse (B, H, Lq) float32: what the
    forward writes, and what the custom ops' fake implementations return (backward.py)."""
    B, H, Lq, D = q.shape
    o = torch.empty((B, Lq, H, D), dtype=q.dtype, device=q.device).transpose(1, 2)
    return o, torch.empty((B, H, Lq), dtype=torch.float32, device=q.device)


def _uses_gluon(q, k, v, impl: str) -> bool:
    """Whether the call runs the Gluon kernel: asked for (an error where it cannot run), or "auto"
    where it can and Lk reaches GLUON_FROM_LK."""
    if impl not in ("auto", "gluon"):
        return False
    reason = forward_hopper.unsupported_reason(q, k, v)
    if impl == "gluon" and reason is not None:
        raise ValueError(f"impl: 'gluon' needs {reason}")
    return reason is None and (impl == "gluon" or k.shape[2] >= GLUON_FROM_LK)


def _checked_forward(q, k, v, scale: float, impl: str = "auto", record: ConfigRecord | None = None):
    """``attention_forward`` for callers that have already checked q, k, v and the scale."""
    B, H, Lq, D = q.shape
    o, lse = _forward_outputs(q)
    if _uses_gluon(q, k, v, impl):
        forward_hopper.forward(q, k, v, o, lse, scale * LOG2E)
        if record is not None:
            record.note("forward", forward_hopper.config_string(D))
        return o, lse
    tensors = (q, k, v, o, lse, scale * LOG2E)
    use_descriptor_scratch()
    precision = dot_precision(q.dtype)
    if not INTERPRET:
        # o and lse are ours: their layout follows from q's shape.
        config = _LAUNCHES.launch((signature_key(q, k, v), impl, precision), tensors, impl)
    else:  # the interpreter: one fixed small config, TMA unless the caller or the strides rule it out
        use_tma = impl != "blockptr" and tma_ok(q, k, v, o)
        args = tensors + _shape_args(q, k, v, o, _IMPL_CHOICE["tma" if use_tma else "blockptr"])
        grid = (cdiv(Lq, _INTERPRETER_CONFIG["BLOCK_M"]) * B * H,)
        _attn_fwd_kernel[grid](
            *args,
            HEAD_DIM=D,
            DOT_PRECISION=precision,
            **_INTERPRETER_CONFIG,
            USE_TMA=use_tma,
            WARP_SPECIALIZE=False,
        )
        config = None
    if record is not None:
        record.note("forward", config_string(config, _INTERPRETER_CONFIG))
    return o, lse


# attention()'s and fused_attention()'s public signature, plus impl: parallel entry points.
def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    *,
    impl: str | None = None,
    record: ConfigRecord | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scale · q kᵀ) v and the natural-log logsumexp of each query row.

    q (B, H, Lq, D); k, v (B, H, Lk, D); D in 16, 32, 64, 128; bf16, fp16 or fp32 (fp32 dots in IEEE
    float32 unless ``torch.set_float32_matmul_precision`` allows TF32); any strides. Returns ``o``
    (B, H, Lq, D) in q's dtype -- a view of a (B, Lq, H, D) buffer, so the usual
    ``o.transpose(1, 2).reshape(B, Lq, H*D)`` is free -- and ``lse`` float32 (B, H, Lq). ``impl``
    picks the kernel: "gluon" (Hopper's warp-specialised kernel: sm_90, bf16/fp16, D 64 or 128,
    TMA-addressable strides; a ValueError elsewhere), "tma" or "blockptr" (the Triton kernel's
    loads; strides TMA cannot take fall back to block pointers), or "auto" (the default): the Gluon
    kernel where it runs and Lk >= GLUON_FROM_LK, else the autotuner measuring both loaders.
    ``record`` (a ``tritonlab.tuning.ConfigRecord``) receives the config the launch used, as
    "forward".
    """
    check_qkv(q, k, v, ndim=4)
    scale = softmax_scale(q.shape[-1], scale)
    impl = impl or "auto"
    check_choice("impl", impl, IMPLS)
    return _checked_forward(q, k, v, scale, impl, record)


__all__ = ["IMPLS", "attention_forward"]
