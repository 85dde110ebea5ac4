"""The forward kernel: rectangular attention with an online softmax, one program per query block.

A program owns BLOCK_M query rows of one (batch, head). It keeps its Q tile in registers and
streams K and V past it in BLOCK_N-row tiles, keeping per row the running maximum ``m`` and the
running sum ``l`` of exponentials (both in the base-2 domain), so the Lq x Lk score matrix never
touches memory. The softmax scale and log2(e) are folded into one multiply so every exponential
is an ``exp2``. Only the last K tile can be partial: the loop over full tiles runs unmasked, and
the tail tile -- if Lk is not a multiple of BLOCK_N -- runs once more with its columns masked.

Two ways to load tiles, chosen by measurement (README): block pointers (``tl.make_block_ptr``,
any strides) and tensor descriptors (``tl.make_tensor_descriptor``, Hopper's TMA copy engine;
needs unit stride along D and 16-byte aligned rows). Both also run in the interpreter.
"""

import math

import torch
import triton
import triton.language as tl

from common import ON_GPU
from common.launch import LaunchCache, autotune_for_launch, signature_key, tma_ok, use_descriptor_scratch

LOG2E = math.log2(math.e)
HEAD_DIMS = (16, 32, 64, 128)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
IMPLS = ("auto", "tma", "blockptr")


# --- input checks, shared by the backward phases ----------------------------------------------


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> float:
    """Raise ``ValueError`` naming the argument at fault; return the softmax scale to use."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name}: expected 4 dimensions (B, H, L, D), got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise ValueError(f"{name}: unsupported dtype {t.dtype}; expected bfloat16, float16 or float32")
        if t.device != q.device:
            raise ValueError(f"{name}: on {t.device}, but q is on {q.device}; all must share one device")
        if t.dtype != q.dtype:
            raise ValueError(f"{name}: dtype {t.dtype} differs from q's {q.dtype}")
    if q.device.type != ("cuda" if ON_GPU else "cpu"):
        raise ValueError(f"q: on {q.device}, but the kernels run on {'cuda' if ON_GPU else 'cpu'} here")
    B, H, Lq, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"k, v: batch {k.shape[0]}, {v.shape[0]} must equal q's batch {B}")
    if k.shape[1] != H or v.shape[1] != H:
        raise ValueError(f"k, v: heads {k.shape[1]}, {v.shape[1]} must equal q's heads {H}")
    if k.shape[3] != D or v.shape[3] != D:
        raise ValueError(f"k, v: head dim {k.shape[3]}, {v.shape[3]} must equal q's head dim {D}")
    if D not in HEAD_DIMS:
        raise ValueError(f"q: unsupported head dim D={D}; expected one of {HEAD_DIMS}")
    if v.shape[2] != k.shape[2]:
        raise ValueError(f"v: {v.shape[2]} keys, but k has {k.shape[2]}; they must match")
    if Lq < 1 or k.shape[2] < 1 or B < 1 or H < 1:
        raise ValueError(f"q, k: every dimension must be >= 1, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale: must be a positive finite number, got {scale}")
    return scale


def shape_bucket(n: int) -> int:
    """Autotuning is keyed on powers of 4, so nearby lengths share one tuned config."""
    return 4 ** max(math.ceil(math.log(max(n, 1), 4)), 0)


# --- the kernel -------------------------------------------------------------------------------


@triton.jit
def _softmax_step(
    acc,
    m_i,
    l_i,
    q,
    k_t,
    v,
    qk_scale,
    col_start,
    Lk,
    MASK_COLS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Fold one K/V tile into the running (acc, m, l) of a query block; k_t is K transposed.

    The row maximum is taken on the raw scores and scaled once per row, so each score costs a
    single fused multiply-add (scale, subtract max) before its exp2; P·V accumulates into acc
    inside the dot.
    """
    s = tl.dot(q, k_t, input_precision=DOT_PRECISION)
    if MASK_COLS:  # only the tail tile: keys past Lk get no weight
        cols = col_start + tl.arange(0, BLOCK_N)
        s = tl.where((cols < Lk)[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = tl.math.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _attn_fwd_kernel(
    Q,
    K,
    V,
    O,
    LSE,
    qk_scale,
    stride_qb,
    stride_qh,
    stride_ql,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kl,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vl,
    stride_vd,
    stride_ob,
    stride_oh,
    stride_ol,
    stride_od,
    H,
    Lq,
    Lk,
    LQ_BUCKET,
    LK_BUCKET,
    IMPL_CHOICE,  # autotuning keys only
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP_BH: tl.constexpr,
    USE_TMA: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # Program order: tl.swizzle2d groups GROUP_BH heads per column of query blocks, so the
    # programs resident at one time share few K/V streams in L2.
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
        acc, m_i, l_i = _softmax_step(
            acc, m_i, l_i, q, k_t, v, qk_scale, j * BLOCK_N, Lk, False, BLOCK_N, DOT_PRECISION
        )
    # The tail: the one partial K tile, its missing rows read as zeros and masked to -inf.
    if n_full * BLOCK_N < Lk:
        if USE_TMA:
            k_t = tl.trans(k_desc.load([n_full * BLOCK_N, 0]))
            v = v_desc.load([n_full * BLOCK_N, 0])
        else:
            k_t = tl.load(kt_ptr, boundary_check=(1,))
            v = tl.load(v_ptr, boundary_check=(0,))
        acc, m_i, l_i = _softmax_step(
            acc, m_i, l_i, q, k_t, v, qk_scale, n_full * BLOCK_N, Lk, True, BLOCK_N, DOT_PRECISION
        )

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


# --- autotuning: the search space, and the one fixed config of the interpreter -----------------

# (BLOCK_M, BLOCK_N, num_warps, num_stages, loader): the search space phase 11 starts from.
# The loader is part of the search: TMA won at mid (long K), block pointers at small (one K tile,
# where building the descriptors on the device costs more than it saves).
FWD_SEARCH_SPACE = [
    (128, 64, 8, 3, "tma"),
    (128, 64, 4, 3, "tma"),
    (128, 64, 4, 4, "tma"),
    (128, 64, 8, 4, "tma"),
    (128, 128, 4, 3, "tma"),
    (64, 64, 4, 3, "blockptr"),
    (128, 64, 4, 3, "blockptr"),
    (128, 64, 8, 3, "blockptr"),
]
INTERPRETER_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 16, "GROUP_BH": 1}
IMPL_CHOICE = {"blockptr": 0, "tma": 1, "auto": 2}
TMA_ONLY_FROM_LK = 16_384  # beyond this, tuning time is spent on TMA configs only


def configs(space, **fixed) -> list:
    """triton.Configs from (BLOCK_M, BLOCK_N, num_warps, num_stages) tuples."""
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, **fixed}, num_warps=w, num_stages=s)
        for bm, bn, w, s in space
    ]


def tuning_bench(kernel_call, quantiles):
    # Each candidate gets 60 ms of timing: about 30 calls at the mid shape, where the candidates lie
    # within 5% of each other and 20 ms (10 calls) let the noise pick (README, session 3); at the
    # large shape one call takes ~0.2 s, so it stays one call.
    return triton.testing.do_bench(kernel_call, warmup=5, rep=60, quantiles=quantiles)


def autotuned(kernel, space, prune, key=("LQ_BUCKET", "LK_BUCKET", "HEAD_DIM"), **fixed):
    """``kernel`` autotuned over ``space``, keyed on the shape buckets (and, implicitly, dtypes)."""
    return triton.autotune(
        configs(space, **fixed),
        key=list(key),
        prune_configs_by={"early_config_prune": prune},
        do_bench=tuning_bench,
    )(kernel)


def _prune(configs, named_args, **kwargs):
    # The loaders the caller allows; tiles that dwarf the problem; fp32 / D=128 need smaller tiles.
    lk, d, choice = named_args["Lk"], kwargs.get("HEAD_DIM", 64), named_args["IMPL_CHOICE"]
    big = named_args["Q"].element_size() * d > 256
    allowed = {0: (False,), 1: (True,), 2: (True,) if lk >= TMA_ONLY_FROM_LK else (True, False)}[choice]
    kept = [
        c
        for c in configs
        if c.kwargs["USE_TMA"] in allowed
        and c.kwargs["BLOCK_N"] <= max(64, triton.next_power_of_2(lk))
        and not (big and c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] > 128 * 64)
    ]
    return kept or [c for c in configs if c.kwargs["USE_TMA"] in allowed][-1:]


_fwd_autotuned = triton.autotune(
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
        for bm, bn, w, st, loader in FWD_SEARCH_SPACE
    ],
    key=["LQ_BUCKET", "LK_BUCKET", "HEAD_DIM", "IMPL_CHOICE"],
    prune_configs_by={"early_config_prune": _prune},
    do_bench=tuning_bench,
)(_attn_fwd_kernel)


def chosen_config(cfg: triton.Config | None, interpreter_config: dict = INTERPRETER_CONFIG) -> str:
    """An autotuner's pick (None in the interpreter), as a compact string for CSV rows."""
    if cfg is None:
        return "interpreter:" + ",".join(f"{k}={v}" for k, v in interpreter_config.items())
    kw = cfg.kwargs
    loader = {True: ",tma", False: ",blockptr"}.get(kw.get("USE_TMA"), "")
    return f"BLOCK_M={kw['BLOCK_M']},BLOCK_N={kw['BLOCK_N']},warps={cfg.num_warps},stages={cfg.num_stages}{loader}"


def last_forward_config() -> str:
    """The config of the most recent forward launch."""
    return chosen_config(LAST_CONFIG.get("config"))


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get exact fp32 dots (no TF32 rounding); 16-bit inputs ignore this."""
    return "ieee" if dtype == torch.float32 else "tf32"


def strides4(t: torch.Tensor) -> tuple:
    return tuple(t.stride())


# --- the entry point ---------------------------------------------------------------------------

DEFAULT_IMPL = "auto"
LAST_CONFIG: dict = {}


def attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None, *, impl: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scale · q kᵀ) v and the natural-log logsumexp of each query row.

    q (B, H, Lq, D); k, v (B, H, Lk, D); any strides. Returns ``o`` (B, H, Lq, D) in q's dtype --
    a view of a (B, Lq, H, D) buffer, so the usual ``o.transpose(1, 2).reshape(B, Lq, H*D)`` is
    free -- and ``lse`` float32 (B, H, Lq). ``impl`` picks the loads: "tma", "blockptr", or
    "auto" (the default), which lets the autotuner measure both; strides TMA cannot take
    (D not contiguous, rows not 16-byte aligned) fall back to block pointers.
    """
    scale = check_inputs(q, k, v, scale)
    impl = impl or DEFAULT_IMPL
    if impl not in IMPLS:
        raise ValueError(f"impl: unknown {impl!r}; expected one of {IMPLS}")
    return checked_forward(q, k, v, scale, impl)


def checked_forward(q, k, v, scale: float, impl: str = DEFAULT_IMPL) -> tuple[torch.Tensor, torch.Tensor]:
    """``attention_forward`` for callers that have already run ``check_inputs`` (phases 03, 04)."""
    B, H, Lq, D = q.shape
    o = torch.empty((B, Lq, H, D), dtype=q.dtype, device=q.device).transpose(1, 2)
    lse = torch.empty((B, H, Lq), dtype=torch.float32, device=q.device)
    tensors = (q, k, v, o, lse, scale * LOG2E)
    use_descriptor_scratch()
    if ON_GPU:
        key = (signature_key(q, k, v), impl)  # o and lse are ours: their layout follows from q's shape
        LAST_CONFIG["config"] = _LAUNCHES.launch(key, tensors, impl)
    else:  # the interpreter: one fixed small config, TMA unless the caller or the strides rule it out
        use_tma = impl != "blockptr" and tma_ok(q, k, v, o)
        args = tensors + _shape_args(q, k, v, o, IMPL_CHOICE["tma" if use_tma else "blockptr"])
        grid = (triton.cdiv(Lq, INTERPRETER_CONFIG["BLOCK_M"]) * B * H,)
        meta = {"HEAD_DIM": D, "DOT_PRECISION": dot_precision(q.dtype)}
        _attn_fwd_kernel[grid](*args, **meta, **INTERPRETER_CONFIG, USE_TMA=use_tma, WARP_SPECIALIZE=False)
    return o, lse


def _shape_args(q, k, v, o, choice: int) -> tuple:
    """The kernel's integer arguments: strides, sizes, the tuning buckets and the loader choice."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    strides = (*strides4(q), *strides4(k), *strides4(v), *strides4(o))
    return (*strides, H, Lq, Lk, shape_bucket(Lq), shape_bucket(Lk), choice)


def _tune_forward(tensors: tuple, impl: str) -> tuple:
    """Autotune (or reuse the tuning of) a new call signature; what a direct launch needs: the
    compiled kernel, its grid, every argument after ``tensors`` (fixed by the signature), the config."""
    q, k, v, o = tensors[:4]
    B, H, Lq, D = q.shape
    shape_args = _shape_args(q, k, v, o, IMPL_CHOICE[impl] if tma_ok(q, k, v, o) else IMPL_CHOICE["blockptr"])
    meta = {"HEAD_DIM": D, "DOT_PRECISION": dot_precision(q.dtype)}
    return autotune_for_launch(
        tensors, _fwd_autotuned, lambda cfg: (triton.cdiv(Lq, cfg["BLOCK_M"]) * B * H,), shape_args, meta
    )


# Per call signature (the strides, shapes, dtypes and alignment of q, k, v, and the loader): the
# compiled kernel the autotuner picked, its grid and constexprs. Later calls with that signature
# launch it directly, skipping the autotuner's and Triton's per-call argument binding -- host time
# that is most of the call at the small shape (README, note 7).
_LAUNCHES = LaunchCache(_tune_forward)
