"""Differentiable rectangular attention with a fused backward, the two-pass backward's gradients
(``backward.py``) from one pass over the score tiles.

On Hopper, where the Gluon kernels run (``backward._uses_gluon``), the fused backward at D = 64 is
``backward_hopper``'s dK/dV kernel with a fifth product per tile: the query tile's dQ = scale · dS K
over a program's 128 keys, computed by one of its two MMA warpgroups (alternating tile by tile) and
added into a float32 buffer with a TMA reduction (``cp.reduce.async.bulk.tensor``) from a ring of
staging tiles, so no program waits for another. Five products a score tile against the two-pass
backward's seven; the order of the dQ sum varies from run to run (within float32 rounding). At
D = 128 that kernel spills and loses to the two-pass backward, which runs there instead.

``deterministic=True``, and every call off Hopper, runs the kernel below instead: one launch
computes Δ, dK, dV and dQ, recomputing the tiles on chip, with no atomics. Why not one program
accumulating all three there? A program that owns a key block keeps its dK and dV in registers,
but its share of dQ must be summed over every key block: with atomics that sum is not
deterministic, and as per-key-block
partials it is n_key_blocks copies of dQ in fp32 -- 7 GB at the TransformerNP's mid shape, 650 GB
at large. The same arithmetic rules out per-query-block partials of dK/dV. So the single launch
holds two kinds of program, each keeping its own tiles on chip and writing its own gradient once:

* key programs (the first ``n_key_programs``): own a K/V block, loop over a chunk of query tiles,
  and accumulate dK, dV (fp32 partials per query chunk when the rows are split, summed by the
  two-pass backward's reduction in a second launch);
* query programs (the rest): own a query tile, loop over every K/V tile, accumulate dQ.

Neither needs the preprocess launch: each computes Δ = rowsum(dO ∘ O) (``_common.row_delta``) for
the query tiles it reads, on chip. The two kinds of program get their own tile shapes (BLOCK_M1 x
BLOCK_N1 for key programs, BLOCK_M2 x BLOCK_N2 for query programs).

When all keys fit one key block (the small shape: M = 64), a key program sees every key, so its
dSᵀ gives each query tile's *complete* dQ = scale·dS K: with ``KEYS_WRITE_DQ`` key programs write
dQ too and no query program is launched. Whether that beats the two-role layout is left to the
autotuner. The tile maths is the two-pass backward's (``_dkdv_tile``, ``_dq_row_block``).

Configs the compiler spills registers for are pruned before tuning (``_drop_spilling``): each
candidate is compiled for the call's arguments and its report read.

**torch.compile.** As ``attention`` (``backward.py``): while Dynamo traces, ``fused_attention`` calls
the custom op ``tritonlab::fused_attention_forward``, whose autograd formula calls
``tritonlab::fused_attention_backward`` (this module's launch); eager calls keep the autograd
function. ``record`` cannot be passed while compiling.
"""

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources, PTXASError

from .._launch import LaunchCache, autotune_for_launch, signature_key
from .._runtime import INTERPRET, cdiv, next_power_of_2
from ..tuning import ConfigRecord, dot_precision, quiet_compile_failures
from ..tuning_tables import autotune
from . import backward_hopper
from ._common import (
    LOG2E,
    backward_delta,
    config_string,
    fits,
    load_rows,
    row_delta,
    shape_bucket,
    small_tiles_only,
    store_rows,
    strides4,
    tuning_bench,
)
from .backward import (
    _attend,
    _attend_kv,
    _attention_ops,
    _dkdv_tile,
    _dq_row_block,
    _key_grad_buffers,
    _like_q_layout,
    _load_lse2,
    _packed_attention_ops,
    _plan_query_chunks,
    _query_chunk,
    _reduce_key_grads,
    _store_key_block,
    _two_pass_backward,
    _uses_gluon,
)


@triton.jit
def _load_query_tile(q_base, do_base, o_base, LSE, bh_offset, row, Lq, stride_ql, stride_qd, stride_gl,
                     stride_gd, stride_ol, stride_od, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                     CHECK: tl.constexpr):  # fmt: skip
    """Q, dO, lse (base 2) and Δ of a query tile; Δ from O and dO on chip."""
    q = load_rows(q_base, stride_ql, stride_qd, row, Lq, BLOCK_M, HEAD_DIM, CHECK)
    do = load_rows(do_base, stride_gl, stride_gd, row, Lq, BLOCK_M, HEAD_DIM, CHECK)
    o = load_rows(o_base, stride_ol, stride_od, row, Lq, BLOCK_M, HEAD_DIM, CHECK)
    return q, do, _load_lse2(LSE, bh_offset, row, Lq, BLOCK_M, CHECK), row_delta(o, do)


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
        k = load_rows(k_base, stride_kl, stride_kd, col_start, Lk, BLOCK_N1, HEAD_DIM, True)
        v = load_rows(v_base, stride_vl, stride_vd, col_start, Lk, BLOCK_N1, HEAD_DIM, True)
        dk = tl.zeros([BLOCK_N1, HEAD_DIM], tl.float32)
        dv = tl.zeros([BLOCK_N1, HEAD_DIM], tl.float32)
        row_begin, row_end, full_end = _query_chunk(pid_c, q_chunk, Lq, BLOCK_M1)
        for row in range(row_begin, full_end, BLOCK_M1):  # full query tiles: no checks
            q, do, lse2, delta = _load_query_tile(q_base, do_base, o_base, LSE, bh_offset, row, Lq, stride_ql,
                                                  stride_qd, stride_gl, stride_gd, stride_ol, stride_od,
                                                  BLOCK_M1, HEAD_DIM, False)  # fmt: skip
            dk, dv, ds_t = _dkdv_tile(dk, dv, k, v, q, do, lse2, delta, qk_scale, DOT_PRECISION)
            if KEYS_WRITE_DQ:
                dq = tl.dot(tl.trans(ds_t).to(k.dtype), k, input_precision=DOT_PRECISION)
                store_rows(dq_base, stride_dl, stride_dd, row, Lq, dq * scale, BLOCK_M1, HEAD_DIM)
        # The loop's step again, with bounds checks: only the ragged last tile pays for them.
        if full_end < row_end:  # the partial last query tile
            q, do, lse2, delta = _load_query_tile(q_base, do_base, o_base, LSE, bh_offset, full_end, Lq, stride_ql,
                                                  stride_qd, stride_gl, stride_gd, stride_ol, stride_od,
                                                  BLOCK_M1, HEAD_DIM, True)  # fmt: skip
            dk, dv, ds_t = _dkdv_tile(dk, dv, k, v, q, do, lse2, delta, qk_scale, DOT_PRECISION)
            if KEYS_WRITE_DQ:
                dq = tl.dot(tl.trans(ds_t).to(k.dtype), k, input_precision=DOT_PRECISION)
                store_rows(dq_base, stride_dl, stride_dd, full_end, Lq, dq * scale, BLOCK_M1, HEAD_DIM)
        _store_key_block(DK, DV, dk * scale, dv, pid_c, b, h, col_start, Lk, stride_dkc, stride_dkb,
                         stride_dkh, stride_dkl, stride_dkd, BLOCK_N1, HEAD_DIM)  # fmt: skip
    else:
        # --- a query program: dQ of one query tile over every key block ---
        row_start = (pid - n_key_blocks * n_chunks) * BLOCK_M2
        q, do, lse2, delta = _load_query_tile(q_base, do_base, o_base, LSE, bh_offset, row_start, Lq, stride_ql,
                                              stride_qd, stride_gl, stride_gd, stride_ol, stride_od, BLOCK_M2,
                                              HEAD_DIM, True)  # fmt: skip
        dq = _dq_row_block(q, do, lse2, delta, k_base, v_base, stride_kl, stride_kd, stride_vl, stride_vd, Lk,
                           qk_scale, BLOCK_M2, BLOCK_N2, HEAD_DIM, DOT_PRECISION)  # fmt: skip
        store_rows(dq_base, stride_dl, stride_dd, row_start, Lq, dq * scale, BLOCK_M2, HEAD_DIM)


# (BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2, num_warps, num_stages, KEYS_WRITE_DQ): key-program
# tiles, query-program tiles, the launch settings both share, and whether key programs write dQ
# (only tried when every key fits one key block). The last entry is a small fallback for fp32 at
# D = 128, kept out of the tuning wherever a larger config fits.
_SEARCH_SPACE = [
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
    (32, 32, 32, 32, 4, 2, False),
]
# Every config but two crashes ptxas (error code -11) in its sm_90a build with Triton 3.6.0 when
# Lq == Lk == 1 (both integers specialised to the constant 1), in bf16 and fp16, at any B and H: a
# compile of the whole space at (B, H, Lq, Lk) = (1, 1, 1, 1), (2, 3, 1, 1), (1, 1, 1, 17),
# (1, 1, 17, 1), (2, 3, 1, 100), (2, 3, 100, 1) and four longer shapes crashed at the first two
# only -- the nine crashes issue 16 saw. _prune drops them there; any other compile failure while
# tuning is one warning line (quiet_compile_failures) and the config is skipped.
_BUILDS_AT_ONE_BY_ONE = {(32, 64, 64, 64, 4, 3, False), (32, 32, 32, 32, 4, 2, False)}
_PTXAS_CRASHES_AT_ONE_BY_ONE = frozenset(_SEARCH_SPACE) - _BUILDS_AT_ONE_BY_ONE
_INTERPRETER_TILES = {"BLOCK_M1": 32, "BLOCK_N1": 16, "BLOCK_M2": 16, "BLOCK_N2": 32}
_FALLBACK_AREA = 32 * 32


def _fits(config, element_size: int, head_dim: int) -> bool:
    """Both roles fit shared memory (key programs keep K, V and stream Q, dO, O; query programs keep
    Q, dO, O and stream K, V); no tile above 64 x 64 where ``small_tiles_only`` says so."""
    kw, stages = config.kwargs, config.num_stages
    m1, n1, m2, n2 = kw["BLOCK_M1"], kw["BLOCK_N1"], kw["BLOCK_M2"], kw["BLOCK_N2"]
    if small_tiles_only(element_size, head_dim) and max(m1 * n1, m2 * 64) > 64 * 64:
        return False
    return fits(element_size, head_dim, fixed_rows=2 * n1, streamed_rows=3 * m1, stages=stages) and fits(
        element_size, head_dim, fixed_rows=3 * m2, streamed_rows=2 * n2, stages=stages
    )


def _space_tuple(config) -> tuple:
    """A config in _SEARCH_SPACE's tuple form."""
    kw = config.kwargs
    tiles = (kw["BLOCK_M1"], kw["BLOCK_N1"], kw["BLOCK_M2"], kw["BLOCK_N2"])
    return (*tiles, config.num_warps, config.num_stages, kw["KEYS_WRITE_DQ"])


def _prune(configs, named_args, **kwargs):
    # Tiles that fit the GPU; for short K, tiles no wider than K; key programs write dQ only where
    # one key block holds every key; none that crashes ptxas; then no config that spills.
    elem, d, lk = named_args["Q"].element_size(), kwargs.get("HEAD_DIM", 64), named_args["Lk"]
    if named_args["Lq"] == 1 and lk == 1:
        configs = [c for c in configs if _space_tuple(c) not in _PTXAS_CRASHES_AT_ONE_BY_ONE]
    width = max(64, next_power_of_2(lk))
    usable = [c for c in configs if not c.kwargs["KEYS_WRITE_DQ"] or lk <= c.kwargs["BLOCK_N1"]]
    fitting = [c for c in usable if _fits(c, elem, d)]
    kept = [
        c
        for c in fitting
        if c.kwargs["BLOCK_N1"] <= width and c.kwargs["BLOCK_M1"] * c.kwargs["BLOCK_N1"] > _FALLBACK_AREA
    ]
    kept = kept or fitting[-1:] or usable[-1:]

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
    config -- the row then records its spills, and the GPU test for the model's shapes fails.
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


_fused_autotuned = autotune(
    [
        triton.Config(
            {"BLOCK_M1": m1, "BLOCK_N1": n1, "BLOCK_M2": m2, "BLOCK_N2": n2, "KEYS_WRITE_DQ": kw},
            num_warps=w,
            num_stages=st,
        )
        for m1, n1, m2, n2, w, st, kw in _SEARCH_SPACE
    ],
    name="attention.fused_backward",
    phase="04_fused_attn",
    key=["LQ_BUCKET", "LK_BUCKET", "HEAD_DIM"],
    dtype_arg="Q",
    prune_configs_by={"early_config_prune": _prune},
    do_bench=tuning_bench,
)(_fused_bwd_kernel)


def _interpreter_config(Lk: int) -> dict:
    return {**_INTERPRETER_TILES, "KEYS_WRITE_DQ": Lk <= _INTERPRETER_TILES["BLOCK_N1"]}


def _grid(cfg: dict, Lq: int, Lk: int, n_bh: int, n_chunks: int) -> tuple[int, int, int]:
    if cfg["KEYS_WRITE_DQ"] and Lk > cfg["BLOCK_N1"]:  # _prune's rule, kept across a bucket
        raise RuntimeError(f"fused backward: a config with KEYS_WRITE_DQ chosen for Lk={Lk}")
    key_blocks = cdiv(Lk, cfg["BLOCK_N1"])
    query_programs = 0 if cfg["KEYS_WRITE_DQ"] else cdiv(Lq, cfg["BLOCK_M2"])
    return (key_blocks * n_chunks + query_programs, n_bh, 1)


def _shape_args(tensors: tuple, q_chunk: int, n_chunks: int) -> tuple:
    """The kernel's integer arguments: strides, sizes, the query chunking, the tuning buckets."""
    q, k, v, o, do, _, dq, dk_partials = tensors[:8]
    H, Lq, Lk = q.shape[1], q.shape[2], k.shape[2]
    strides = (*strides4(q), *strides4(k), *strides4(v), *strides4(o), *strides4(do))
    strides += (*strides4(dq), *dk_partials.stride())  # (chunk, b, h, l, d)
    return (*strides, H, Lq, Lk, q_chunk, n_chunks, shape_bucket(Lq), shape_bucket(Lk))


def _tune(tensors: tuple, q_chunk: int, n_chunks: int) -> tuple:
    """Autotune (or reuse the tuning of) a new call signature; what a direct launch needs: the
    compiled kernel, its grid, every argument after ``tensors`` (fixed by the signature), and
    the compiler's report."""
    q, k = tensors[:2]
    (B, H, Lq, D), Lk = q.shape, k.shape[2]
    meta = {"HEAD_DIM": D, "DOT_PRECISION": dot_precision(q.dtype)}
    with quiet_compile_failures("fused attention backward"):
        kernel, grid, other_args, config = autotune_for_launch(
            tensors,
            _fused_autotuned,
            lambda cfg: _grid(cfg, Lq, Lk, B * H, n_chunks),
            _shape_args(tensors, q_chunk, n_chunks),
            meta,
        )
    return kernel, grid, other_args, {"config": config, "n_regs": kernel.n_regs, "n_spills": kernel.n_spills}


# Per call signature (shapes, strides, dtypes, alignment of q, k, v, o, do; the dot precision): the
# compiled kernel the autotuner chose and its launch settings, launched directly on later calls --
# the per-call binding of this kernel's 60 arguments is host time that shows at the small shape.
_LAUNCHES = LaunchCache(_tune)


def _deterministic_fused_backward(q, k, v, o, lse, do, scale: float, record: ConfigRecord | None = None):
    """dQ and the stacked (dK, dV), as ``_two_pass_backward``'s, in one launch (plus the chunk
    reduction when the query rows are split); no atomics."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    q_chunk = _plan_query_chunks(Lq, Lk, B * H)
    n_chunks = cdiv(Lq, q_chunk)
    grads, partials = _key_grad_buffers(k, n_chunks)
    dq = _like_q_layout(q)
    tensors = (q, k, v, o, do, lse, dq, partials[:, 0], partials[:, 1], scale, scale * LOG2E)
    precision = dot_precision(q.dtype)
    if not INTERPRET:
        # lse, dq and the partials are ours: fixed layouts.
        report = _LAUNCHES.launch((signature_key(q, k, v, o, do), precision), tensors, q_chunk, n_chunks)
    else:
        config = _interpreter_config(Lk)
        args = tensors + _shape_args(tensors, q_chunk, n_chunks)
        _fused_bwd_kernel[_grid(config, Lq, Lk, B * H, n_chunks)](
            *args, HEAD_DIM=D, DOT_PRECISION=precision, **config
        )
        report = {"config": None}
    _reduce_key_grads(partials, grads)
    if record is not None:
        record.note("fused", config_string(report["config"], _INTERPRETER_TILES))
        for key in ("n_regs", "n_spills"):
            if key in report:
                record.note(key, str(report[key]))
    return dq, grads


def _fused_backward(q, k, v, o, lse, do, scale: float, record: ConfigRecord | None = None):
    """The fused backward: on Hopper, where the Gluon kernels run, ``backward_hopper``'s dK/dV kernel
    adding each tile's dQ into a float32 buffer with TMA reductions (see the module docstring) at
    the head dims it has a config for (``FUSED_CONFIGS``: D = 64), the two-pass backward at the
    others (at D = 128 the fused kernel spills and measured 5.57 against 5.00 ms at mid); elsewhere
    the deterministic one-launch kernel."""
    if not _uses_gluon(q, k, v, do):
        return _deterministic_fused_backward(q, k, v, o, lse, do, scale, record)
    D = q.shape[-1]
    if D not in backward_hopper.FUSED_CONFIGS:
        return _two_pass_backward(q, k, v, o, lse, do, scale, record)
    # dQ's float32 sum in the model's layout, zeroed by Δ's launch: its bf16 copy is then one
    # contiguous conversion, not a transposing one.
    dq_sum = _like_q_layout(q, torch.float32)
    delta = backward_delta(o, do, zero=dq_sum)
    grads, _ = _key_grad_buffers(k, n_chunks=1)
    backward_hopper.dkdv(q, k, v, lse, do, delta, grads, scale, dq=dq_sum)
    dq = dq_sum.to(q.dtype)
    if record is not None:
        record.note("fused", backward_hopper.config_string(D, fused=True))
    return dq, grads


# The custom ops torch.compile sees: backward.py's forward op with this module's backwards.
_FUSED_ATTENTION_FORWARD = _attention_ops("fused_attention", _fused_backward)
_DETERMINISTIC_FUSED_ATTENTION_FORWARD = _attention_ops(
    "deterministic_fused_attention", _deterministic_fused_backward
)
_FUSED_ATTENTION_KV_FORWARD = _packed_attention_ops("fused_attention_kv", _fused_backward)
_DETERMINISTIC_FUSED_ATTENTION_KV_FORWARD = _packed_attention_ops(
    "deterministic_fused_attention_kv", _deterministic_fused_backward
)


# attention()'s public signature (backward.py) and ``deterministic``: only the backward differs.
def fused_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    *,
    deterministic: bool = False,
    record: ConfigRecord | None = None,
) -> torch.Tensor:
    """Differentiable rectangular attention, softmax(scale · q kᵀ) v, with a fused backward. Inputs
    as ``attention_forward``'s. On Hopper (bf16/fp16, D = 64, TMA-addressable inputs, keys past
    ``forward.GLUON_FROM_LK``) dQ is summed in float32 by TMA reductions in no fixed order, so it may
    differ from run to run in the last bits; ``deterministic=True`` takes the one-launch kernel
    without atomics there too. At D = 128 there the two-pass backward runs (faster, deterministic).
    ``record`` receives the configs of the forward ("forward") and of the backward ("fused", with the
    compiler's "n_regs" and "n_spills" for the deterministic kernel); it cannot be passed under
    torch.compile."""
    backward_fn, forward_op = (
        (_deterministic_fused_backward, _DETERMINISTIC_FUSED_ATTENTION_FORWARD)
        if deterministic
        else (_fused_backward, _FUSED_ATTENTION_FORWARD)
    )
    return _attend(q, k, v, scale, record, backward_fn, forward_op, "fused_attention")


def fused_attention_kv(
    q: torch.Tensor,
    kv: torch.Tensor,
    scale: float | None = None,
    *,
    deterministic: bool = False,
    record: ConfigRecord | None = None,
) -> torch.Tensor:
    """``fused_attention`` with K and V packed as a model projects them: ``kv`` (B, Lk, 2, H, D), k =
    kv[:, :, 0] and v = kv[:, :, 1] (transposed to (B, H, Lk, D)), e.g. ``w_kv(x).view(B, Lk, 2, H,
    D)``. The same results; kv's gradient is the backward's dK/dV buffer itself, where separate k and
    v leave autograd (or torch.compile) a copy that interleaves their gradients (0.65 ms a training
    step of the TransformerNP at mid on the H100)."""
    backward_fn, forward_op = (
        (_deterministic_fused_backward, _DETERMINISTIC_FUSED_ATTENTION_KV_FORWARD)
        if deterministic
        else (_fused_backward, _FUSED_ATTENTION_KV_FORWARD)
    )
    return _attend_kv(q, kv, scale, record, backward_fn, forward_op, "fused_attention_kv")


__all__ = ["fused_attention", "fused_attention_kv"]
