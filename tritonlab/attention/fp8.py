"""FP8 (e4m3) rectangular attention for Hopper: Q, K, V quantised per block, fp32 accumulation.

    o = softmax(scale · q kᵀ) v,   lse = logsumexp(scale · q kᵀ)   (natural log, per query row)

for q (B, H, Lq, D) over k, v (B, H, Lk, D), bf16 or fp16, D in 64 or 128, no mask; ``o`` in q's
dtype, ``lse`` float32 -- the contract of ``forward.attention_forward``, computed from e4m3 values:

* K and V, per block of ``KV_BLOCK`` = 128 keys of one (batch, head): ``s_k = amax|K_blk| / 448``
  and ``K8 = e4m3(K_blk / s_k)`` (448 is e4m3's largest finite value; an all-zero block gets
  s = 1). V first loses its per-channel mean over the block's keys, μ (fp32, (B·H, Lk'/KV_BLOCK,
  D)), and the rest is quantised the same way: e4m3's 3 bits then round what varies from key to
  key. A V riding on a common offset (20 ± 0.2, say) otherwise lost the variation to rounding
  (step 2 at 20) and with it dQ and dK (relative error 2.96, interpreter); with μ apart, 0.055.
  One launch (``_quantize_kv_kernel``) reads K and V once, in any strides, and
  writes K8 as (B·H, Lk', D) and V8 *transposed*, (B·H, D, Lk'), with Lk' = Lk rounded up to
  KV_BLOCK and the padding zero; the scales are fp32 (B·H, Lk'/KV_BLOCK). Vᵀ makes the P·V
  product's B operand key-major, the layout Hopper's fp8 ``wgmma`` takes from shared memory.
* Q, per block of BLOCK_M query rows, inside the forward: each program loads its bf16 Q tile once,
  takes its amax and converts it to e4m3 in registers (``s_q``); no extra launch or memory pass.
* S = s_q · s_k · (Q8 K8ᵀ), one fp8 dot per tile with fp32 accumulation; the tile's two scales and
  scale·log2(e) fold into one scalar per tile, so the online softmax (running max ``m``, running sum
  ``l``, base 2, as ``_common.online_softmax_tile``) costs what the bf16 one does.
* P = exp2(S' − m_new) ∈ (0, 1] is quantised as ``P8 = e4m3(448 · P)`` and multiplied with V8 in a
  second fp8 dot. The largest P of a tile is exactly 1 when the tile holds the running maximum --
  for *every* key whose score ties it (all-equal scores: P = 1 for all keys), and 448 · 1 = 448 is
  representable, so ties cost nothing and cannot overflow. Where rounding of the fused
  multiply-subtract gives P a hair above 1, the conversion saturates at 448 instead of becoming
  NaN (Hopper's ``cvt.rn.satfinite``; the exact rounding below clamps). ``l`` sums the unquantised
  P, so each row's weights are those of the fp32 softmax up to P8's rounding.
* P·V is P8·V8 (scaled) plus rowsum(P)·μ of the tile's block, added in fp32 into the
  accumulator the dot adds to (one multiply-add per output element a tile).
* The V scale varies per key block, so it cannot leave the sum over keys at the end: the
  accumulator is kept in units of the current tile's ``s_v``, and moving to a tile with another
  scale multiplies the per-row rescale factor α = exp2(m_old − m_new) by s_v,old / s_v,new -- a
  scalar folded into a multiply the online softmax does anyway. At the end
  ``o = acc · s_v,last / (448 · l)`` and ``lse = (m + log2 l) · ln 2``.

Hopper's fp8 tensor cores run at about twice the bf16 rate; what the kernel still pays in full is
the exponentials (one per score, as in bf16) and the amax/convert of each Q tile.

**Accuracy.** e4m3 keeps 3 mantissa bits (relative rounding ≤ 2⁻⁴): the scores carry the rounding
of Q and K, the output that of P and V, and these do not average out (O shrinks with the keys as
its error does). Against a float64 reference, unit-variance inputs give a relative Frobenius error
of O of 4–6% in the interpreter's exact emulation (phase 02's kernel in fp16: 0.03%), and lse
within 0.16 (one key, 8 000 rows); the tests hold the kernel to ``ERROR_BOUND`` and
``LSE_BOUND``. The backward is a bf16 backward -- on Hopper ``fused.py``'s fused one, elsewhere
``backward.py``'s two-pass one -- run at the quantised inputs q̃, k̃, ṽ (e4m3 times scale, plus V's
block means, back in bf16), so that the P it recomputes is the one whose scores this forward's lse
sums; their gradients pass straight through to q, k, v. dQ, dK, dV are then those of the attention
the forward computed (within ``STE_BOUND``), off the exact ones by what the forward is off
(``GRAD_BOUND``).

**Two forward kernels.** On Hopper the forward runs ``fp8_hopper``'s Gluon kernel (warp-specialised
like ``forward_hopper``'s bf16 one; Q quantised per warpgroup of 64 rows, the same arithmetic);
elsewhere, and with ``impl="triton"``, this module's Triton kernel below (Q per program of BLOCK_M
rows). The backward's q̃ takes the block of the kernel that ran.

**Where it runs.** FP8 needs compute capability ≥ 8.9 (``supports_fp8``). Elsewhere -- an A100, the
CPU -- ``fp8_attention`` and ``fp8_attention_forward`` run the bf16 kernels of ``forward.py`` and
``backward.py`` instead and log once, at warning level, which path they took; ``force_fp8=True``
makes that an error. The kernels themselves also run in Triton's interpreter (``_fp8_forward``,
what the CPU tests and phase 05's CPU run call): its fp8 dots are right, but its fp32 → e4m3 cast
drops the carry when rounding crosses a power of two, so there every conversion first rounds
exactly (``EXACT_CAST``, ``tritonlab.ops.fp8.round_to_e4m3``) and the cast then only stores the
bits; on the GPU the hardware conversion rounds the same way in one instruction.
"""

import functools
import logging

import torch
import triton
import triton.language as tl

from .._launch import LaunchCache, autotune_for_launch, first_launch, signature_key, use_descriptor_scratch
from .._runtime import INTERPRET, capability, cdiv, next_power_of_2
from ..checks import check_choice
from ..ops.fp8 import FP8_DTYPE, FP8_MAX, round_to_e4m3
from ..tuning import ConfigRecord, quiet_compile_failures, refuse_record_under_compile
from ..tuning_tables import autotune
from . import forward_hopper, fp8_hopper
from ._common import (  # much the same list as backward.py's: a declaration, not logic
    LOG2E,
    check_qkv,
    config_string,
    fits,
    load_rows,
    shape_bucket,
    smallest,
    softmax_scale,
    strides4,
    tuning_bench,
)
from .backward import _attention_ops, _two_pass_backward
from .backward import _uses_gluon as _backward_uses_gluon
from .backward import attention as _bf16_attention
from .forward import _checked_forward, _forward_outputs
from .fused import _fused_backward

logger = logging.getLogger("tritonlab")

FP8_HEAD_DIMS = (64, 128)  # fp8 wgmma reduces over 32 elements: D = 16 or 32 is not worth a path
FP8_INPUT_DTYPES = (torch.bfloat16, torch.float16)
KV_BLOCK = 128  # keys per K and V scale; every BLOCK_N divides it, so a K/V tile has one scale
MIN_CAPABILITY = (8, 9)
_E4M3_MAX = tl.constexpr(FP8_MAX)  # 448, as the kernels see it
# What the tests and phase 05 hold the FP8 attention to against float64, for inputs of unit
# variance: the relative Frobenius error of O (measured: 4-6%; e4m3 rounds P and V by up to 2**-4
# each), the largest absolute error of lse (from the rounding of Q and K; worst with one key, where
# lse is one score: rms 0.037, largest 0.16 over 8 000 rows; 0.026 at 1 000 keys), and the relative
# Frobenius error of dQ, dK, dV (measured: 4-7%, the forward's own error: they are the gradients of
# the quantised attention); and that of dQ, dK, dV against the float64 gradient of attention at the
# quantised inputs q̃, k̃, ṽ (measured: 0.03-0.7% at unit variance, 1.3% at inputs x3). On Hopper
# the error of O grows with the key tiles one accumulator sums (e4m3 wgmma adds in reduced
# precision): fp8_hopper runs long rows in key chunks (MAX_SUM_TILES) to stay within ERROR_BOUND.
ERROR_BOUND = 0.08
LSE_BOUND = 0.25
GRAD_BOUND = 0.08
STE_BOUND = 0.02


# --- quantisation of one tile ------------------------------------------------------------------


@triton.jit
def _to_e4m3(x, EXACT_CAST: tl.constexpr):
    """fp32 ``x`` (|x| ≤ 448 up to rounding) to e4m3, round to nearest even, saturating at ±448."""
    if EXACT_CAST:  # the interpreter: its own cast mis-rounds (see the module docstring)
        return round_to_e4m3(tl.clamp(x, -_E4M3_MAX, _E4M3_MAX)).to(tl.float8e4nv)
    return x.to(tl.float8e4nv)


@triton.jit
def _quantize_tile(x, EXACT_CAST: tl.constexpr):
    """A whole tile to e4m3 with one fp32 scale amax/448 (1 for an all-zero tile): (x8, scale)."""
    x = x.to(tl.float32)
    amax = tl.max(tl.max(tl.abs(x), 1), 0)
    scale = tl.where(amax > 0.0, amax / _E4M3_MAX, 1.0)
    return _to_e4m3(x * (1.0 / scale), EXACT_CAST), scale


@triton.jit
def _quantize_centred(x, first, n, BLOCK: tl.constexpr, EXACT_CAST: tl.constexpr):
    """A tile of BLOCK rows from row ``first`` of ``n`` (rows past ``n`` read as zeros) less its
    per-channel mean over the rows that exist, to e4m3: (x8, scale, mean), the mean fp32. e4m3's 3
    bits then round what varies from row to row, not a common offset riding on it; rows past ``n``
    count in neither the mean nor the scale."""
    x = x.to(tl.float32)
    rows = first + tl.arange(0, BLOCK)
    mean = tl.sum(x, 0) / tl.minimum(n - first, BLOCK).to(tl.float32)
    x8, scale = _quantize_tile(tl.where((rows < n)[:, None], x - mean[None, :], 0.0), EXACT_CAST)
    return x8, scale, mean


# --- 1. K and V to e4m3, per block of KV_BLOCK keys; V written transposed -------------------------


@triton.jit
def _quantize_kv_kernel(
    K, V, K8, V8T, KS, VS, VM,
    stride_kb, stride_kh, stride_kl, stride_kd,
    stride_vb, stride_vh, stride_vl, stride_vd,
    H, Lk, Lk_pad, n_blocks,
    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, EXACT_CAST: tl.constexpr,
):  # fmt: skip
    pid_n, pid_bh = tl.program_id(0), tl.program_id(1)
    b, h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)
    bh = pid_bh.to(tl.int64)
    col = pid_n * BLOCK
    # Keys past Lk read as zeros, so the padding of K8 and V8ᵀ is zero and the forward loads whole tiles.
    k = load_rows(K + b * stride_kb + h * stride_kh, stride_kl, stride_kd, col, Lk, BLOCK, HEAD_DIM, True)
    v = load_rows(V + b * stride_vb + h * stride_vh, stride_vl, stride_vd, col, Lk, BLOCK, HEAD_DIM, True)
    k8, k_scale = _quantize_tile(k, EXACT_CAST)
    keys = col + tl.arange(0, BLOCK)
    dims = tl.arange(0, HEAD_DIM)
    v8, v_scale, v_mean = _quantize_centred(v, col, Lk, BLOCK, EXACT_CAST)
    tl.store(K8 + bh * Lk_pad * HEAD_DIM + keys[:, None] * HEAD_DIM + dims[None, :], k8)
    tl.store(V8T + bh * HEAD_DIM * Lk_pad + dims[:, None] * Lk_pad + keys[None, :], tl.trans(v8))
    tl.store(KS + bh * n_blocks + pid_n, k_scale)
    tl.store(VS + bh * n_blocks + pid_n, v_scale)
    tl.store(VM + (bh * n_blocks + pid_n) * HEAD_DIM + dims, v_mean)


# 8 warps: at D = 128, 4 spill (ptxas, sm_90a: 404 bytes); 8 use 207 registers and spill nothing.
_QUANTIZE_WARPS = 8
# Per signature of k and v (the outputs' layouts follow from their shapes), and of the tensor the
# backward dequantises: the compiled kernel, launched directly after the first call, as the forward's.
_DIRECT_LAUNCHES = LaunchCache(first_launch)


def _quantize_kv(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(K8 (B·H, Lk', D), K scales (B·H, Lk'/KV_BLOCK), V8ᵀ (B·H, D, Lk'), V scales, V means
    (B·H, Lk'/KV_BLOCK, D)) for k, v (B, H, Lk, D) in any strides; Lk' is Lk rounded up to KV_BLOCK,
    the padding zero. V8ᵀ holds V less its block's means."""
    B, H, Lk, D = k.shape
    n_blocks = cdiv(Lk, KV_BLOCK)
    lk_pad = n_blocks * KV_BLOCK
    k8 = torch.empty((B * H, lk_pad, D), dtype=FP8_DTYPE, device=k.device)
    v8t = torch.empty((B * H, D, lk_pad), dtype=FP8_DTYPE, device=k.device)
    k_scales = torch.empty((B * H, n_blocks), dtype=torch.float32, device=k.device)
    v_scales = torch.empty_like(k_scales)
    v_means = torch.empty((B * H, n_blocks, D), dtype=torch.float32, device=k.device)
    tensors = (k, v, k8, v8t, k_scales, v_scales, v_means)
    shape_args = (*strides4(k), *strides4(v), H, Lk, lk_pad, n_blocks)
    meta = {"HEAD_DIM": D, "BLOCK": KV_BLOCK, "EXACT_CAST": INTERPRET}
    if INTERPRET:
        _quantize_kv_kernel[(n_blocks, B * H)](*tensors, *shape_args, **meta)
    else:
        _DIRECT_LAUNCHES.launch(
            (_quantize_kv_kernel, signature_key(k, v)), tensors, _quantize_kv_kernel, (n_blocks, B * H),
            shape_args, {**meta, "num_warps": _QUANTIZE_WARPS},
        )  # fmt: skip
    return k8, k_scales, v8t, v_scales, v_means


@triton.jit
def _dequantize_kernel(
    X, XD, stride_xb, stride_xh, stride_xl, stride_xd, H, L,
    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, CENTRED: tl.constexpr, EXACT_CAST: tl.constexpr,
):  # fmt: skip
    """x̃ = e4m3(x / s) · s per block of BLOCK rows of one (batch, head), with the forward's own
    ``_quantize_tile`` (so bit for bit the values its fp8 products took), in x's dtype, into XD
    (B, H, L, D) contiguous: what the backward recomputes P from. ``CENTRED`` (V): the block's
    per-channel mean comes off before and back after, as ``_quantize_kv_kernel`` takes it."""
    pid_n, pid_bh = tl.program_id(0), tl.program_id(1)
    b, h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)
    row = pid_n * BLOCK
    x = load_rows(X + b * stride_xb + h * stride_xh, stride_xl, stride_xd, row, L, BLOCK, HEAD_DIM, True)
    rows = row + tl.arange(0, BLOCK)
    dims = tl.arange(0, HEAD_DIM)
    if CENTRED:
        x8, scale, mean = _quantize_centred(x, row, L, BLOCK, EXACT_CAST)
        x_hat = x8.to(tl.float32) * scale + mean[None, :]
    else:
        x8, scale = _quantize_tile(x, EXACT_CAST)
        x_hat = x8.to(tl.float32) * scale
    out = XD + pid_bh.to(tl.int64) * L * HEAD_DIM + rows[:, None] * HEAD_DIM + dims[None, :]
    tl.store(out, x_hat.to(XD.dtype.element_ty), mask=(rows < L)[:, None])


def _dequantize(x: torch.Tensor, block: int, centred: bool = False) -> torch.Tensor:
    """x̃ (B, H, L, D), contiguous, in x's dtype: x quantised per block of ``block`` rows as the
    forward quantises it, and multiplied back by the block's scale; ``centred``: less the block's
    per-channel mean before, plus it after (V)."""
    B, H, L, D = x.shape
    out = torch.empty((B, H, L, D), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    tensors, grid = (x, out), (cdiv(L, block), B * H)
    shape_args = (*strides4(x), H, L)
    meta = {"HEAD_DIM": D, "BLOCK": block, "CENTRED": centred, "EXACT_CAST": INTERPRET}
    if INTERPRET:
        _dequantize_kernel[grid](*tensors, *shape_args, **meta)
    else:
        _DIRECT_LAUNCHES.launch(
            (_dequantize_kernel, signature_key(x), block, centred), tensors, _dequantize_kernel, grid,
            shape_args, {**meta, "num_warps": _QUANTIZE_WARPS},
        )  # fmt: skip
    return out


# --- 2. the forward: Q quantised per program, fp8 dots, online softmax -----------------------------


@triton.jit
def _fp8_softmax_tile(acc, m_i, l_i, v_unit, s, v8, v_mean, score_scale, v_scale, EXACT_CAST: tl.constexpr):
    """Fold one tile of raw fp8-product scores ``s`` (-inf where a key does not count) and its V8 tile
    into (acc, m, l); ``score_scale`` = scale·log2(e)·s_q·s_k, so m and l live in base 2. ``acc`` is
    in units of ``v_unit`` (the V scale of the tile before), and leaves in units of ``v_scale``.
    V8 holds the tile's V less ``v_mean`` (its block's per-channel mean, fp32): P·V = P8·V8 scaled,
    plus rowsum(P) times the mean, added in fp32."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * score_scale)
    p = tl.math.exp2(s * score_scale - m_new[:, None])
    rescale = tl.math.exp2(m_i - m_new)  # what earlier tiles accumulated, under the new maximum
    p_sum = tl.sum(p, 1)
    l_i = l_i * rescale + p_sum
    p8 = _to_e4m3(p * _E4M3_MAX, EXACT_CAST)  # P ≤ 1, so 448·P fits; ties of the max give exactly 448
    to_units = _E4M3_MAX / v_scale  # real values -> the accumulator's units
    acc = acc * (rescale * (v_unit / v_scale))[:, None] + (p_sum * to_units)[:, None] * v_mean[None, :]
    acc = tl.dot(p8, v8, acc)
    return acc, m_new, l_i, v_scale


@triton.jit
def _fp8_fwd_kernel(
    Q, K8, V8T, KS, VS, VM, O, LSE, qk_scale,
    stride_qb, stride_qh, stride_ql, stride_qd,
    stride_ob, stride_oh, stride_ol, stride_od,
    H, Lq, Lk, Lk_pad, n_kv_blocks,
    LQ_BUCKET, LK_BUCKET,  # autotuning keys only
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KV_BLOCK: tl.constexpr,
    USE_TMA: tl.constexpr, EXACT_CAST: tl.constexpr,
):  # fmt: skip
    # Consecutive programs take consecutive query blocks of one head: they stream the same K8, V8ᵀ.
    n_m = tl.cdiv(Lq, BLOCK_M)
    pid = tl.program_id(0)
    pid_bh, pid_m = pid // n_m, pid % n_m
    b, h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)
    bh = pid_bh.to(tl.int64)
    row_start = pid_m * BLOCK_M
    q = load_rows(
        Q + b * stride_qb + h * stride_qh, stride_ql, stride_qd, row_start, Lq, BLOCK_M, HEAD_DIM, True
    )
    q8, q_scale = _quantize_tile(q, EXACT_CAST)
    row_scale = qk_scale * q_scale

    k_base = K8 + bh * Lk_pad * HEAD_DIM
    vt_base = V8T + bh * HEAD_DIM * Lk_pad
    if USE_TMA:  # K8 and V8ᵀ are ours: contiguous, 16-byte aligned rows
        k_desc = tl.make_tensor_descriptor(k_base, [Lk_pad, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_N, HEAD_DIM])
        vt_desc = tl.make_tensor_descriptor(vt_base, [HEAD_DIM, Lk_pad], [Lk_pad, 1], [HEAD_DIM, BLOCK_N])
    else:
        kt_ptr = tl.make_block_ptr(
            k_base, (HEAD_DIM, Lk_pad), (1, HEAD_DIM), (0, 0), (HEAD_DIM, BLOCK_N), (0, 1)
        )
        vt_ptr = tl.make_block_ptr(
            vt_base, (HEAD_DIM, Lk_pad), (Lk_pad, 1), (0, 0), (HEAD_DIM, BLOCK_N), (1, 0)
        )
    scales = bh * n_kv_blocks
    dims = tl.arange(0, HEAD_DIM)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    v_unit = 1.0
    # Every tile lies inside Lk' (BLOCK_N divides KV_BLOCK), so no load is checked; the loop over full
    # tiles has no mask, and the tail tile -- if Lk is not a multiple of BLOCK_N -- masks its keys.
    n_full = Lk // BLOCK_N
    for j in range(n_full):
        if USE_TMA:
            k_t = tl.trans(k_desc.load([j * BLOCK_N, 0]))
            v8 = tl.trans(vt_desc.load([0, j * BLOCK_N]))
        else:
            k_t = tl.load(kt_ptr)
            v8 = tl.trans(tl.load(vt_ptr))
            kt_ptr = tl.advance(kt_ptr, (0, BLOCK_N))
            vt_ptr = tl.advance(vt_ptr, (0, BLOCK_N))
        block = scales + (j * BLOCK_N) // KV_BLOCK
        s = tl.dot(q8, k_t)
        v_mean = tl.load(VM + block * HEAD_DIM + dims)
        acc, m_i, l_i, v_unit = _fp8_softmax_tile(
            acc, m_i, l_i, v_unit, s, v8, v_mean, row_scale * tl.load(KS + block), tl.load(VS + block),
            EXACT_CAST,
        )  # fmt: skip
    if n_full * BLOCK_N < Lk:
        if USE_TMA:
            k_t = tl.trans(k_desc.load([n_full * BLOCK_N, 0]))
            v8 = tl.trans(vt_desc.load([0, n_full * BLOCK_N]))
        else:
            k_t = tl.load(kt_ptr)
            v8 = tl.trans(tl.load(vt_ptr))
        block = scales + (n_full * BLOCK_N) // KV_BLOCK
        cols = n_full * BLOCK_N + tl.arange(0, BLOCK_N)
        s = tl.where((cols < Lk)[None, :], tl.dot(q8, k_t), float("-inf"))
        v_mean = tl.load(VM + block * HEAD_DIM + dims)
        acc, m_i, l_i, v_unit = _fp8_softmax_tile(
            acc, m_i, l_i, v_unit, s, v8, v_mean, row_scale * tl.load(KS + block), tl.load(VS + block),
            EXACT_CAST,
        )  # fmt: skip

    acc = acc * (v_unit / _E4M3_MAX) / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453  # base 2 back to natural log
    rows = row_start + tl.arange(0, BLOCK_M)
    tl.store(LSE + bh * Lq + rows, lse, mask=rows < Lq)
    o_ptr = tl.make_block_ptr(
        O + b * stride_ob + h * stride_oh, (Lq, HEAD_DIM), (stride_ol, stride_od), (row_start, 0),
        (BLOCK_M, HEAD_DIM), (1, 0),
    )  # fmt: skip
    tl.store(o_ptr, acc.to(O.dtype.element_ty), boundary_check=(0,))


# --- the launch: autotuning over tiles and loader, then direct launches --------------------------

# (BLOCK_M, BLOCK_N, num_warps, num_stages, loader, head dims). On the H100 at D = 64 the one-warpgroup
# 64-row tiles win (64 x 64 at mid, 64 x 128 at large, tables/h100_fp8.json); 128-row 8-warp tiles
# are 8-35% slower there.
# The head dims of each are those where ptxas (sm_90a, Triton 3.6) reports no spills: at D = 128 a
# 128 x 128 tile needs more than 255 registers a thread at 8 warps, and 4 warps spill at 128 rows.
# One byte per element halves the bf16 kernel's shared memory, so every one of these fits an H100.
_SEARCH_SPACE = [
    (128, 128, 8, 3, "tma", (64,)),
    (128, 128, 8, 2, "tma", (64,)),
    (128, 128, 8, 4, "tma", (64,)),
    (128, 64, 8, 3, "tma", (64, 128)),
    (128, 64, 8, 4, "tma", (64, 128)),
    (64, 128, 4, 3, "tma", (64,)),
    (64, 64, 4, 3, "tma", (64, 128)),
    (128, 128, 8, 3, "blockptr", (64, 128)),
]
_HEAD_DIMS_OF = {(bm, bn, w, st, loader == "tma"): dims for bm, bn, w, st, loader, dims in _SEARCH_SPACE}
_INTERPRETER_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32, "USE_TMA": True}  # the tests also run USE_TMA=False


def _fits(config, head_dim: int) -> bool:
    """Q8 once, K8 and V8ᵀ tiles per pipeline stage, one byte each."""
    bm, bn = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]
    return fits(1, head_dim, fixed_rows=bm, streamed_rows=2 * bn, stages=config.num_stages)


def _key(config) -> tuple:
    kw = config.kwargs
    return (kw["BLOCK_M"], kw["BLOCK_N"], config.num_warps, config.num_stages, kw["USE_TMA"])


def _prune(configs, named_args, **kwargs):
    # Configs that do not spill at this head dim and fit the GPU; K tiles no longer than the keys need.
    lk, d = named_args["Lk"], kwargs.get("HEAD_DIM", 64)
    usable = [c for c in configs if d in _HEAD_DIMS_OF[_key(c)] and _fits(c, d)]
    kept = [c for c in usable if c.kwargs["BLOCK_N"] <= max(64, next_power_of_2(lk))]
    return kept or smallest(usable or configs, "BLOCK_M", "BLOCK_N")


_fwd_autotuned = autotune(
    [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "USE_TMA": loader == "tma"}, num_warps=w, num_stages=st)
        for bm, bn, w, st, loader, _ in _SEARCH_SPACE
    ],
    name="attention.fp8_forward",
    phase="05_fp8_attn",
    key=["LQ_BUCKET", "LK_BUCKET", "HEAD_DIM"],
    dtype_arg="K8",  # the table is the fp8 one (h100_fp8.json), whatever q's 16-bit dtype
    runs_on_sm80=lambda config: False,  # e4m3 tensor cores need sm_89 or later
    prune_configs_by={"early_config_prune": _prune},
    do_bench=tuning_bench,
)(_fp8_fwd_kernel)


def _shape_args(q, o, Lk: int, lk_pad: int, n_blocks: int) -> tuple:
    H, Lq = q.shape[1], q.shape[2]
    return (*strides4(q), *strides4(o), H, Lq, Lk, lk_pad, n_blocks, shape_bucket(Lq), shape_bucket(Lk))


def _tune(tensors: tuple, shape_args: tuple) -> tuple:
    q = tensors[0]
    B, H, Lq, D = q.shape
    meta = {"HEAD_DIM": D, "KV_BLOCK": KV_BLOCK, "EXACT_CAST": False}
    with quiet_compile_failures("fp8 attention forward"):
        return autotune_for_launch(
            tensors, _fwd_autotuned, lambda cfg: (cdiv(Lq, cfg["BLOCK_M"]) * B * H,), shape_args, meta
        )


# Per call signature (q's shape, strides, dtype, alignment; Lk, which the padded K8 does not give):
# the compiled kernel the autotuner picked.
_LAUNCHES = LaunchCache(_tune)


IMPLS = ("auto", "gluon", "triton")


def _uses_gluon(q, impl: str) -> bool:
    """Whether the forward runs ``fp8_hopper``'s Gluon kernel: under "auto" wherever it can, under
    "gluon" or a ``ValueError`` saying what it needs; "triton" keeps this module's kernel."""
    if impl == "triton":
        return False
    reason = forward_hopper.unsupported_reason(q)  # K8 and V8ᵀ are ours: only q's strides matter
    if impl == "gluon" and reason is not None:
        raise ValueError(f"impl: 'gluon' needs {reason}")
    return reason is None


def _fp8_forward_tiled(q, k, v, scale: float, record: ConfigRecord | None = None, impl: str = "auto"):
    """(o, lse, BLOCK_M) from the FP8 kernels, for checked inputs: the quantisation launch, then the
    forward (``impl``: ``_uses_gluon``); BLOCK_M is the query rows that share one Q scale. On a GPU
    with FP8, or in Triton's interpreter (exact rounding, one fixed config)."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    gluon = _uses_gluon(q, impl)
    k8, k_scales, v8t, v_scales, v_means = _quantize_kv(k, v)
    o, lse = _forward_outputs(q)
    if gluon:
        fp8_hopper.forward(q, k8, k_scales, v8t, v_scales, v_means, o, lse, scale * LOG2E, KV_BLOCK, Lk)
        if record is not None:
            record.note("forward", fp8_hopper.config_string(D, Lk))
        return o, lse, fp8_hopper.ROWS_PER_WARPGROUP
    tensors = (q, k8, v8t, k_scales, v_scales, v_means, o, lse, scale * LOG2E)
    shape_args = _shape_args(q, o, Lk, k8.shape[1], k_scales.shape[1])
    use_descriptor_scratch()
    if not INTERPRET:
        config = _LAUNCHES.launch((signature_key(q), Lk), tensors, shape_args)
    else:
        grid = (cdiv(Lq, _INTERPRETER_CONFIG["BLOCK_M"]) * B * H,)
        _fp8_fwd_kernel[grid](
            *tensors, *shape_args, HEAD_DIM=D, KV_BLOCK=KV_BLOCK, EXACT_CAST=True,
            **_INTERPRETER_CONFIG,
        )  # fmt: skip
        config = None
    if record is not None:
        record.note("forward", config_string(config, _INTERPRETER_CONFIG))
    return o, lse, (config.kwargs if config is not None else _INTERPRETER_CONFIG)["BLOCK_M"]


def _fp8_forward(q, k, v, scale: float, record: ConfigRecord | None = None, impl: str = "auto"):
    """(o, lse) of ``_fp8_forward_tiled``."""
    o, lse, _ = _fp8_forward_tiled(q, k, v, scale, record, impl)
    return o, lse


def _q_block(q, lk: int) -> int:
    """The query rows that shared one Q scale in the last ``_fp8_forward`` (impl "auto") on q's
    signature and ``lk`` keys: 64 for the Gluon kernel, else the Triton launch's BLOCK_M."""
    if _uses_gluon(q, "auto"):
        return fp8_hopper.ROWS_PER_WARPGROUP
    if INTERPRET:
        return _INTERPRETER_CONFIG["BLOCK_M"]
    config = _LAUNCHES.info((signature_key(q), lk))
    if config is None:
        raise RuntimeError(
            "fp8 attention backward: no forward launch for this q's signature to take Q's block from"
        )
    return config.kwargs["BLOCK_M"]


def _dequantized(q, k, v, block_m: int) -> tuple[torch.Tensor, ...]:
    """q̃, k̃, ṽ: the values the forward's fp8 products multiplied (e4m3 times scale; V plus its
    block's means), in q's dtype; Q per block of ``block_m`` rows as the forward's programs take it,
    K and V per KV_BLOCK keys."""
    return _dequantize(q, block_m), _dequantize(k, KV_BLOCK), _dequantize(v, KV_BLOCK, centred=True)


class _FP8AttentionFunction(torch.autograd.Function):
    """The FP8 forward, saving the bf16 q, k, v, its o and lse; the backward is a bf16 backward
    (``_fp8_backward``) at the quantised values q̃, k̃, ṽ (``_dequantized``), whose scores
    are the ones this forward's lse sums, passed straight through to q, k, v. Recomputing P from the
    unquantised inputs instead mixes two sets of scores: where attention is peaked, P exceeds 1 and
    the gradients go wrong (relative error 19% at inputs x2, 98% at x4 in the interpreter; on the
    H100 a 300-step training run's loss jumped at step 200 and did not recover)."""

    @staticmethod
    def forward(ctx, q, k, v, scale, record, impl="auto"):
        ctx.scale, ctx.record = scale, record
        o, lse, ctx.block_m = _fp8_forward_tiled(q, k, v, scale, record, impl)
        ctx.save_for_backward(q, k, v, o, lse)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dkv = _fp8_backward(q, k, v, o, lse, do, ctx.scale, ctx.block_m, ctx.record)
        return dq, dkv[0], dkv[1], None, None, None


def _fp8_backward(q, k, v, o, lse, do, scale: float, block_m: int, record=None):
    """dQ and the stacked (dK, dV) at q̃, k̃, ṽ (Q quantised per ``block_m`` rows): where the Gluon
    kernels run, phase 04's fused backward (faster than the two-pass one there)."""
    qd, kd, vd = _dequantized(q, k, v, block_m)
    gluon = _backward_uses_gluon(qd, kd, vd, do)
    return (_fused_backward if gluon else _two_pass_backward)(qd, kd, vd, o, lse, do, scale, record)


# The custom ops torch.compile sees: the FP8 forward ("auto") and its backward, which finds the Q
# block of the forward that ran on the same signature.
_FP8_ATTENTION_FORWARD = _attention_ops(
    "fp8_attention",
    lambda q, k, v, o, lse, do, scale: _fp8_backward(q, k, v, o, lse, do, scale, _q_block(q, k.shape[2])),
    _fp8_forward,
)


# --- the public functions ------------------------------------------------------------------------


def supports_fp8(device: torch.device | int | None = None) -> bool:
    """Whether ``device`` (the current CUDA device by default) has FP8 tensor cores (compute
    capability ≥ 8.9). False in Triton's interpreter and without a GPU."""
    if INTERPRET or not torch.cuda.is_available():
        return False
    return capability(device) >= MIN_CAPABILITY


@functools.cache
def _warn_fallback(where: str) -> None:
    logger.warning("fp8 attention: no FP8 on %s; running the bf16 attention kernels instead", where)


def _fp8_or_fallback(q, k, v, scale, force_fp8: bool, impl: str) -> tuple[float, bool]:
    """Check the inputs; (the softmax scale, whether the FP8 kernels run)."""
    check_qkv(q, k, v, ndim=4, dtypes=FP8_INPUT_DTYPES, head_dims=FP8_HEAD_DIMS)
    check_choice("impl", impl, IMPLS)
    scale = softmax_scale(q.shape[-1], scale)
    if supports_fp8(q.device):
        return scale, True
    if INTERPRET:
        where = "the CPU (Triton's interpreter)"
    else:
        where = f"{torch.cuda.get_device_name(q.device)} (compute capability {torch.cuda.get_device_capability(q.device)})"
    if force_fp8 or impl == "gluon":
        argument = "force_fp8" if force_fp8 else "impl"
        raise ValueError(f"{argument}: FP8 attention needs compute capability >= 8.9, and this is {where}")
    _warn_fallback(where)
    return scale, False


# attention_forward()'s public signature, force_fp8 for impl: parallel entry points.
def fp8_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    *,
    force_fp8: bool = False,
    impl: str = "auto",
    record: ConfigRecord | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scale · q kᵀ) v computed in e4m3 with per-block scales, and the natural-log
    logsumexp of each query row.

    q (B, H, Lq, D); k, v (B, H, Lk, D); D in 64, 128; bf16 or fp16; any strides and lengths ≥ 1.
    Returns ``o`` (B, H, Lq, D) in q's dtype, a view of a (B, Lq, H, D) buffer, and ``lse`` float32
    (B, H, Lq). The quantisation of q, k, v is part of the call. Without FP8 (``supports_fp8``) the
    bf16 kernels run instead, with one warning; ``force_fp8=True`` raises a ``ValueError`` there.
    ``impl``: "auto" runs the Gluon kernel (``fp8_hopper``) on Hopper where q's strides allow it and
    this module's Triton kernel elsewhere; "gluon" asks for the first (a ``ValueError`` where it
    cannot run), "triton" for the second. ``record`` receives the config of the forward's launch,
    as "forward".

    Speed (H100, phase 05's report): at D = 64, 1.03x / 1.10x the bf16 ``attention_forward`` at
    10 000 / 200 000 keys, where the softmax rather than the products bounds both; 0.50x at 64 keys,
    where the separate K/V quantisation launch costs as much as the forward. At D = 128, 0.96x at
    10 000 keys and 1.12x cuDNN (1.01x the bf16 forward) at 200 000, where the rows run in two key
    chunks (``fp8_hopper.MAX_SUM_TILES``) to keep O's error within ``ERROR_BOUND``.
    """
    scale, use_fp8 = _fp8_or_fallback(q, k, v, scale, force_fp8, impl)
    if use_fp8:
        return _fp8_forward(q, k, v, scale, record, impl)
    return _checked_forward(q, k, v, scale, record=record)


# fp8_attention_forward()'s signature: the differentiable entry point beside it.
def fp8_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    *,
    force_fp8: bool = False,
    impl: str = "auto",
    record: ConfigRecord | None = None,
) -> torch.Tensor:
    """Differentiable ``fp8_attention_forward``: the FP8 forward, then a bf16 backward at the
    quantised inputs (dQ, dK, dV in the inputs' dtype, in the layout of the model's projections):
    where the Gluon kernels run, ``fused_attention``'s fused backward (dQ summed by TMA reductions
    in no fixed order), elsewhere ``attention``'s two-pass one. Inputs, fallback, ``force_fp8`` and
    ``impl`` as ``fp8_attention_forward``'s; ``record`` receives the configs of the forward and the
    backward ("forward", and "fused" or "dkdv" and "dq"). Under torch.compile it runs as the custom
    ops ``tritonlab::fp8_attention_forward``/``_backward``, with ``impl="auto"`` and no ``record``.
    """
    scale, use_fp8 = _fp8_or_fallback(q, k, v, scale, force_fp8, impl)
    if use_fp8 and torch.compiler.is_compiling():
        refuse_record_under_compile(record, "fp8_attention")
        if impl != "auto":
            raise ValueError(f"impl: under torch.compile fp8_attention runs impl='auto', got {impl!r}")
        return _FP8_ATTENTION_FORWARD(q, k, v, scale)[0]
    if use_fp8:
        return _FP8AttentionFunction.apply(q, k, v, scale, record, impl)
    return _bf16_attention(q, k, v, scale, record=record)


__all__ = [
    "ERROR_BOUND",
    "FP8_HEAD_DIMS",
    "GRAD_BOUND",
    "LSE_BOUND",
    "fp8_attention",
    "fp8_attention_forward",
    "supports_fp8",
]
