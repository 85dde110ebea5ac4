"""The fused backward: one launch computes Δ, dK, dV and dQ, recomputing the tiles on chip.

Why not one program accumulating all three gradients? A program that owns a key block keeps its
dK and dV in registers, but its share of dQ must be summed over every key block: with atomics
that sum is not deterministic, and as per-key-block partials it is n_key_blocks copies of dQ in
fp32 -- 7 GB at the mid shape, 650 GB at large. The same arithmetic rules out per-query-block
partials of dK/dV. So the single launch holds two kinds of program, each keeping its own tiles
on chip and writing its own gradient once:

* key programs (the first ``n_key_programs``): own a K/V block, loop over a chunk of query
  tiles, and accumulate dK, dV (fp32 partials per query chunk when the rows are split, summed by
  phase 03's reduction in a second pass);
* query programs (the rest): own a query tile, loop over every K/V tile, accumulate dQ.

Neither needs a preprocess launch: each computes Δ = rowsum(dO ∘ O) for the query tiles it
reads, on chip, instead of reading a Δ written by a separate kernel. The two kinds of program
get their own tile shapes (BLOCK_M1 x BLOCK_N1 for key programs, BLOCK_M2 x BLOCK_N2 for query
programs), as phase 03's two kernels do.

When all keys fit one key block (the small shape: M = 64), a key program sees every key, so
its dSᵀ gives each query tile's *complete* dQ = scale·dS K: with ``KEYS_WRITE_DQ`` key programs
write dQ too and the query programs are not launched -- one program per (batch·head, query chunk)
computes all three gradients, reading Q, dO and O once. Whether that beats the two-role layout
(fewer, longer programs against more, shorter ones) is left to the autotuner. The tile maths is
phase 03's (``dkdv_tile``, ``dq_tile``).

The issue forbids register spills, so configs the compiler spills for are pruned before tuning
(``_drop_spilling``): each candidate is compiled for the call's arguments and its report read.
"""

import importlib

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources, PTXASError

from common import ON_GPU
from common.launch import LaunchCache, autotune_for_launch, signature_key

fwd = importlib.import_module("phases.02_attn_fwd")
bwd = importlib.import_module("phases.03_attn_bwd")


@triton.jit
def _load_query_tile(q_base, do_base, o_base, LSE, bh_offset, row, Lq, stride_ql, stride_qd, stride_gl,
                     stride_gd, stride_ol, stride_od, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                     CHECK: tl.constexpr):  # fmt: skip
    """Q, dO, lse (base 2) and Δ of a query tile; Δ from O and dO on chip."""
    q = bwd.load_rows(q_base, stride_ql, stride_qd, row, Lq, BLOCK_M, HEAD_DIM, CHECK)
    do = bwd.load_rows(do_base, stride_gl, stride_gd, row, Lq, BLOCK_M, HEAD_DIM, CHECK)
    o = bwd.load_rows(o_base, stride_ol, stride_od, row, Lq, BLOCK_M, HEAD_DIM, CHECK)
    return q, do, bwd.load_lse2(LSE, bh_offset, row, Lq, BLOCK_M, CHECK), bwd.row_delta(o, do)


@triton.jit
def _store_rows(base, stride_l, stride_d, row, Lq, tile, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    ptr = tl.make_block_ptr(base, (Lq, HEAD_DIM), (stride_l, stride_d), (row, 0), (BLOCK_M, HEAD_DIM), (1, 0))
    tl.store(ptr, tile.to(base.dtype.element_ty), boundary_check=(0,))


@triton.jit
def _fused_bwd_kernel(
    Q, K, V, O, DO, LSE, DQ, DK, DV, scale, qk_scale,
    stride_qb, stride_qh, stride_ql, stride_qd,
    stride_kb, stride_kh, stride_kl, stride_kd,
    stride_vb, stride_vh, stride_vl, stride_vd,
    stride_ob, stride_oh, stride_ol, stride_od,
    stride_gb, stride_gh, stride_gl, stride_gd,
    stride_db, stride_dh, stride_dl, stride_dd,
    stride_dkc, stride_dkb, stride_dkh, stride_dkl, stride_dkd,
    H, Lq, Lk, q_chunk, n_chunks,
    LQ_BUCKET, LK_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_M2: tl.constexpr,
    BLOCK_N2: tl.constexpr, KEYS_WRITE_DQ: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    pid, pid_bh = tl.program_id(0), tl.program_id(1)
    b, h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)
    q_base = Q + b * stride_qb + h * stride_qh
    do_base = DO + b * stride_gb + h * stride_gh
    o_base = O + b * stride_ob + h * stride_oh
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    dq_base = DQ + b * stride_db + h * stride_dh
    bh_offset = pid_bh.to(tl.int64) * Lq
    # KEYS_WRITE_DQ only with one key block (the host guarantees it): then no query program runs.
    n_key_blocks = tl.cdiv(Lk, BLOCK_N1)
    if pid < n_key_blocks * n_chunks:
        # --- a key program: dK, dV of one key block over one chunk of query rows ---
        pid_n, pid_c = pid % n_key_blocks, pid // n_key_blocks
        col_start = pid_n * BLOCK_N1
        k = bwd.load_rows(k_base, stride_kl, stride_kd, col_start, Lk, BLOCK_N1, HEAD_DIM, True)
        v = bwd.load_rows(v_base, stride_vl, stride_vd, col_start, Lk, BLOCK_N1, HEAD_DIM, True)
        dk = tl.zeros([BLOCK_N1, HEAD_DIM], tl.float32)
        dv = tl.zeros([BLOCK_N1, HEAD_DIM], tl.float32)
        row_begin = pid_c * q_chunk
        row_end = tl.minimum(row_begin + q_chunk, Lq)
        full_end = row_begin + (row_end - row_begin) // BLOCK_M1 * BLOCK_M1
        for row in range(row_begin, full_end, BLOCK_M1):  # full query tiles: no checks
            q, do, lse2, delta = _load_query_tile(q_base, do_base, o_base, LSE, bh_offset, row, Lq, stride_ql,
                                                  stride_qd, stride_gl, stride_gd, stride_ol, stride_od,
                                                  BLOCK_M1, HEAD_DIM, False)  # fmt: skip
            dk, dv, ds_t = bwd.dkdv_tile(dk, dv, k, v, q, do, lse2, delta, qk_scale, DOT_PRECISION)
            if KEYS_WRITE_DQ:
                dq = tl.dot(tl.trans(ds_t).to(k.dtype), k, input_precision=DOT_PRECISION)
                _store_rows(dq_base, stride_dl, stride_dd, row, Lq, dq * scale, BLOCK_M1, HEAD_DIM)
        if full_end < row_end:  # the partial last query tile
            q, do, lse2, delta = _load_query_tile(q_base, do_base, o_base, LSE, bh_offset, full_end, Lq, stride_ql,
                                                  stride_qd, stride_gl, stride_gd, stride_ol, stride_od,
                                                  BLOCK_M1, HEAD_DIM, True)  # fmt: skip
            dk, dv, ds_t = bwd.dkdv_tile(dk, dv, k, v, q, do, lse2, delta, qk_scale, DOT_PRECISION)
            if KEYS_WRITE_DQ:
                dq = tl.dot(tl.trans(ds_t).to(k.dtype), k, input_precision=DOT_PRECISION)
                _store_rows(dq_base, stride_dl, stride_dd, full_end, Lq, dq * scale, BLOCK_M1, HEAD_DIM)
        bwd.store_key_block(DK, DV, dk * scale, dv, pid_c, b, h, col_start, Lk, stride_dkc, stride_dkb,
                            stride_dkh, stride_dkl, stride_dkd, BLOCK_N1, HEAD_DIM)  # fmt: skip
    else:
        # --- a query program: dQ of one query tile over every key block ---
        row_start = (pid - n_key_blocks * n_chunks) * BLOCK_M2
        q, do, lse2, delta = _load_query_tile(q_base, do_base, o_base, LSE, bh_offset, row_start, Lq, stride_ql,
                                              stride_qd, stride_gl, stride_gd, stride_ol, stride_od, BLOCK_M2,
                                              HEAD_DIM, True)  # fmt: skip
        dq = bwd.dq_row_block(q, do, lse2, delta, k_base, v_base, stride_kl, stride_kd, stride_vl, stride_vd, Lk,
                              qk_scale, BLOCK_M2, BLOCK_N2, HEAD_DIM, DOT_PRECISION)  # fmt: skip
        _store_rows(dq_base, stride_dl, stride_dd, row_start, Lq, dq * scale, BLOCK_M2, HEAD_DIM)


# (BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2, num_warps, num_stages, KEYS_WRITE_DQ): key-program
# tiles, query-program tiles, the launch settings both share, and whether key programs write dQ
# (only tried when every key fits one key block). The search space phase 11 starts from.
FUSED_SEARCH_SPACE = [
    (32, 128, 128, 64, 4, 3, False),
    (32, 128, 128, 64, 8, 3, False),
    (64, 128, 128, 64, 8, 3, False),
    (32, 128, 64, 64, 4, 3, False),
    (64, 64, 64, 64, 4, 3, False),
    (64, 64, 128, 64, 8, 2, False),
    (32, 64, 64, 64, 4, 3, False),
    (64, 64, 64, 64, 4, 3, True),
    (32, 64, 64, 64, 4, 3, True),
    (128, 64, 64, 64, 8, 3, True),
]
INTERPRETER_TILES = {"BLOCK_M1": 32, "BLOCK_N1": 16, "BLOCK_M2": 16, "BLOCK_N2": 32}


def _prune(configs, named_args, **kwargs):
    # fp32 or D=128 tiles overflow shared memory and registers; for short K, tiles no wider than K;
    # key programs write dQ only where one key block holds every key; then no config that spills.
    big = named_args["Q"].element_size() * kwargs.get("HEAD_DIM", 64) > 256
    lk = named_args["Lk"]
    width = max(64, triton.next_power_of_2(lk))
    kept = [
        c
        for c in configs
        if c.kwargs["BLOCK_N1"] <= width
        and (not c.kwargs["KEYS_WRITE_DQ"] or lk <= c.kwargs["BLOCK_N1"])
        and not (
            big and max(c.kwargs["BLOCK_M1"] * c.kwargs["BLOCK_N1"], c.kwargs["BLOCK_M2"] * 64) > 64 * 64
        )
    ]
    kept = kept or [c for c in configs if not c.kwargs["KEYS_WRITE_DQ"]][-1:]

    # The autotuner hands the prune its own launch arguments (grid, warmup) with the call's meta.
    meta = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}

    def compile_for_call(config):
        kernel = _fused_bwd_kernel.warmup(*named_args.values(), grid=(1,), **meta, **config.all_kwargs())
        kernel = kernel.result() if hasattr(kernel, "result") else kernel
        kernel._init_handles()  # loads the binary: this is where registers and spills are read
        return kernel

    return _drop_spilling(kept, compile_for_call)


def _drop_spilling(configs, compile_for_call):
    """The configs whose compiled kernel spills no registers (and compiles at all).

    If every one spills, the one that spills least, so that a call never fails for lack of a
    config -- the row then records its spills, and the GPU test for the TNP shapes fails.
    """
    spills = {}
    for config in configs:
        try:
            spills[config] = compile_for_call(config).n_spills
        except (OutOfResources, PTXASError):
            continue
    clean = [c for c in configs if spills.get(c) == 0]
    if clean:
        return clean
    return [min(spills, key=spills.get)] if spills else configs[-1:]


_fused_autotuned = triton.autotune(
    [
        triton.Config(
            {"BLOCK_M1": m1, "BLOCK_N1": n1, "BLOCK_M2": m2, "BLOCK_N2": n2, "KEYS_WRITE_DQ": kw},
            num_warps=w,
            num_stages=st,
        )
        for m1, n1, m2, n2, w, st, kw in FUSED_SEARCH_SPACE
    ],
    key=["LQ_BUCKET", "LK_BUCKET", "HEAD_DIM"],
    prune_configs_by={"early_config_prune": _prune},
    do_bench=fwd.tuning_bench,
)(_fused_bwd_kernel)

# What the compiler reported for the most recent launch on a GPU: the config, registers, spills.
COMPILE_REPORT: dict = {}


def _interpreter_config(Lk: int) -> dict:
    return {**INTERPRETER_TILES, "KEYS_WRITE_DQ": Lk <= INTERPRETER_TILES["BLOCK_N1"]}


def last_fused_config() -> dict:
    if not ON_GPU:
        return {"fused_config": "interpreter:" + ",".join(f"{k}={v}" for k, v in INTERPRETER_TILES.items())}
    cfg = COMPILE_REPORT["config"]
    tiles = ",".join(f"{k}={v}" for k, v in cfg.kwargs.items())
    report = {k: v for k, v in COMPILE_REPORT.items() if k != "config"}
    return {"fused_config": f"{tiles},warps={cfg.num_warps},stages={cfg.num_stages}", **report}


def _grid(cfg: dict, Lq: int, Lk: int, n_bh: int, n_chunks: int) -> tuple[int, int, int]:
    if cfg["KEYS_WRITE_DQ"] and Lk > cfg["BLOCK_N1"]:  # _prune's rule, kept across a bucket
        raise RuntimeError(f"fused backward: a config with KEYS_WRITE_DQ chosen for Lk={Lk}")
    key_blocks = triton.cdiv(Lk, cfg["BLOCK_N1"])
    query_programs = 0 if cfg["KEYS_WRITE_DQ"] else triton.cdiv(Lq, cfg["BLOCK_M2"])
    return (key_blocks * n_chunks + query_programs, n_bh, 1)


def _shape_args(tensors: tuple, q_chunk: int, n_chunks: int) -> tuple:
    """The kernel's integer arguments: strides, sizes, the query chunking, the tuning buckets."""
    q, k, v, o, do, _, dq, dk_partials = tensors[:8]
    H, Lq, Lk = q.shape[1], q.shape[2], k.shape[2]
    strides = (*fwd.strides4(q), *fwd.strides4(k), *fwd.strides4(v), *fwd.strides4(o), *fwd.strides4(do))
    strides += (*fwd.strides4(dq), *dk_partials.stride())  # (chunk, b, h, l, d)
    return (*strides, H, Lq, Lk, q_chunk, n_chunks, fwd.shape_bucket(Lq), fwd.shape_bucket(Lk))


def _tune(tensors: tuple, q_chunk: int, n_chunks: int) -> tuple:
    """Autotune (or reuse the tuning of) a new call signature; what a direct launch needs: the
    compiled kernel, its grid, every argument after ``tensors`` (fixed by the signature), and
    the compiler's report."""
    q, k = tensors[:2]
    (B, H, Lq, D), Lk = q.shape, k.shape[2]
    meta = {"HEAD_DIM": D, "DOT_PRECISION": fwd.dot_precision(q.dtype)}
    kernel, grid, other_args, config = autotune_for_launch(
        tensors,
        _fused_autotuned,
        lambda cfg: _grid(cfg, Lq, Lk, B * H, n_chunks),
        _shape_args(tensors, q_chunk, n_chunks),
        meta,
    )
    return kernel, grid, other_args, {"config": config, "n_regs": kernel.n_regs, "n_spills": kernel.n_spills}


# Per call signature (shapes, strides, dtypes, alignment of q, k, v, do): the compiled kernel the
# autotuner chose and its launch settings. Later calls launch it directly: the autotuner's and
# Triton's per-call binding of this kernel's 60 arguments is host time that shows at the small
# shape, where a whole forward + backward takes 0.12 ms of GPU time (README, note 9).
_LAUNCHES = LaunchCache(_tune)


def fused_attention_backward(q, k, v, o, lse, do, scale: float):
    """dQ, dK, dV in one launch (plus the chunk reduction when the query rows are split)."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    q_chunk = bwd.plan_query_chunks(Lq, Lk, B * H)
    n_chunks = triton.cdiv(Lq, q_chunk)
    grads, partials = bwd.key_grad_buffers(k, n_chunks)
    dq = bwd.like_q_layout(q)
    tensors = (q, k, v, o, do, lse, dq, partials[:, 0], partials[:, 1], scale, scale * fwd.LOG2E)
    if ON_GPU:
        key = signature_key(q, k, v, o, do)  # lse, dq and the partials are ours: fixed layouts
        COMPILE_REPORT.update(_LAUNCHES.launch(key, tensors, q_chunk, n_chunks))
    else:
        config = _interpreter_config(Lk)
        args = tensors + _shape_args(tensors, q_chunk, n_chunks)
        meta = {"HEAD_DIM": D, "DOT_PRECISION": fwd.dot_precision(q.dtype)}
        _fused_bwd_kernel[_grid(config, Lq, Lk, B * H, n_chunks)](*args, **meta, **config)
    bwd.reduce_key_grads(partials, grads)
    return dq, grads[0], grads[1]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Differentiable rectangular attention: phase 02's forward, the fused one-launch backward (phase
    03's autograd wrapper, given this backward)."""
    return bwd.AttentionFunction.apply(q, k, v, scale, fused_attention_backward)
