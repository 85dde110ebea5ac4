"""flash2's cells: naive attention eager and compiled (attention-bench, compile-bench),
FlashAttention-2 in Triton against naive PyTorch and SDPA (flash-bench), and the tile tuner.

Every cell checks before it times: the compiled naive function against eager, every flash-bench
implementation against SDPA's fp32 memory-efficient kernel (O, dQ, dK, dV), each tuner candidate
against the table's tiles. A cell is one pass (fwd, bwd or fwd+bwd) of one implementation; the
passes of one implementation share its inputs and its check. A naive cell whose arithmetic peak
exceeds the card is an ``oom`` row without running.
"""

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch._functorch.config
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from common import DEVICE, ON_GPU, Cell, OutOfMemory, check_close, measure_peak_memory, timed
from tritonlab.attention import (
    FlashAttentionTriton,
    TileConfig,
    attention_flops,
    causal_mask,
    naive_attention,
)
from tritonlab.attention.flash2 import TUNE_CANDIDATES, flash_backward, flash_forward, tile_config
from tritonlab.testing import DTYPES, rel_err

# Hopper: where FlashAttentionTriton's "auto" runs the Gluon kernels (tritonlab.attention.flash2).
GLUON_GPU = ON_GPU and torch.cuda.get_device_capability()[0] == 9

SDPA_BACKENDS = {
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa-math": SDPBackend.MATH,
}
GOAL_SHAPE = (16, 16384, 64)  # (B, N, D): causal bf16 forward+backward, the leaderboard shape
PASSES = ("fwd", "bwd", "fwd+bwd")


@dataclass(frozen=True)
class Budget:
    """How long each timing runs: exactly ``passes`` timed calls, or a time budget (``--quick``)."""

    passes: int | None
    warmup_ms: float = 100.0
    rep_ms: float = 500.0

    def bench_kw(self) -> dict:
        if self.passes is not None:
            return {"warmup_ms": self.warmup_ms, "min_reps": self.passes, "max_reps": self.passes}
        return {"warmup_ms": self.warmup_ms, "rep_ms": self.rep_ms, "min_reps": 3, "max_reps": 100}


QUICK = Budget(passes=None, warmup_ms=20.0, rep_ms=60.0)


def random_qkv(batch: int, n: int, head_dim: int, dtype: torch.dtype, n_keys: int | None = None):
    """Fresh normal q, k, v that require grad (never zeros: a kernel can be fast on zeros)."""
    n_keys = n_keys or n
    make = lambda rows: torch.randn(batch, rows, head_dim, device=DEVICE, dtype=dtype, requires_grad=True)
    return make(n), make(n_keys), make(n_keys)


def naive_peak_bytes(
    batch: int, n: int, head_dim: int, dtype: torch.dtype, causal: bool, squares: int = 4
) -> int:
    """What naive attention's forward+backward holds at its peak, by arithmetic: the (B, N, N) score
    matrix exists ``squares`` times over -- four in a backward (the saved softmax, dP, dS and the
    gradient of the unscaled scores), one more while another pass's graph is retained -- plus the
    mask, plus q, k, v, O and their gradients."""
    elt = torch.finfo(dtype).bits // 8
    square = batch * n * n * elt
    return squares * square + (n * n if causal else 0) + 8 * batch * n * head_dim * elt


def _refuse_if_too_big(estimate: int) -> None:
    """An ``oom`` row without running when the estimated peak exceeds the card."""
    total = torch.cuda.get_device_properties(0).total_memory if ON_GPU else 0
    if ON_GPU and estimate > total:
        raise OutOfMemory(f"not run: estimated peak {estimate / 1e9:.1f} GB > {total / 1e9:.1f} GB")


def _columns(bench_name: str, batch: int, n: int, head_dim: int, causal: bool, pass_: str, **extra) -> dict:
    return {
        "bench": bench_name,
        "batch": batch,
        "seq": n,
        "head_dim": head_dim,
        "causal": causal,
        "pass": pass_,
        **extra,
    }


def _shape(batch: int, n: int, head_dim: int) -> str:
    return f"B={batch} N={n} D={head_dim}"


# --- attention-bench and compile-bench: naive attention, eager or compiled -------------------------


def naive_cells(
    bench_name: str, *, head_dims, seqs, batch: int, dtype_name: str, budget: Budget
) -> Iterator[Cell]:
    """Naive attention (einsum, softmax, einsum), forward and backward timed separately (the backward
    re-runs on a retained graph), memory in use before the backward; compile-bench adds
    ``torch.compile(naive_attention, dynamic=True)`` side by side, checked against eager."""
    dtype = DTYPES[dtype_name]
    impls = {"naive": (naive_attention, None)}
    if bench_name == "compile":
        impls = {
            "eager": (naive_attention, None),
            "compile": (torch.compile(naive_attention, dynamic=True), naive_attention),
        }
    for head_dim in head_dims:
        for n in seqs:
            estimate = naive_peak_bytes(batch, n, head_dim, dtype, causal=False)
            for variant, (fn, reference) in impls.items():
                state = functools.cache(
                    functools.partial(_naive_state, fn, reference, batch, n, head_dim, dtype, estimate)
                )
                for pass_ in ("fwd", "bwd"):
                    columns = _columns(
                        bench_name, batch, n, head_dim, False, pass_, mem_estimate_gb=estimate / 1e9
                    )
                    run = functools.partial(_naive_pass, state, fn, pass_, budget)
                    yield Cell(variant, _shape(batch, n, head_dim), dtype_name, run, columns)
                state.cache_clear()
            if ON_GPU:
                torch.cuda.empty_cache()  # the largest naive cells come close to filling the card


def _naive_state(fn, reference, batch, n, head_dim, dtype, estimate):
    _refuse_if_too_big(estimate)
    q, k, v = random_qkv(batch, n, head_dim, dtype)
    out = fn(q, k, v)
    extra = {}
    if reference is not None:  # the compiled function must give eager's answer
        expected = reference(q, k, v)
        extra["max_err_vs_eager"] = (out - expected).abs().max().item()
        check_close(
            "compiled against eager (max abs)",
            extra["max_err_vs_eager"],
            1e-2 if dtype != torch.float32 else 1e-4,
        )
    return q, k, v, out, extra


def _naive_pass(state, fn, pass_: str, budget: Budget) -> dict:
    with measure_peak_memory() as mem:
        q, k, v, out, extra = state()
        if pass_ == "fwd":
            row = timed(lambda: fn(q, k, v), **budget.bench_kw())
        else:
            mem_before_bwd = torch.cuda.memory_allocated() if ON_GPU else 0
            grad_out = torch.randn_like(out)
            row = timed(
                lambda: torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True), **budget.bench_kw()
            )
            extra = {**extra, "mem_before_bwd_gb": mem_before_bwd / 1e9}
    return {**extra, **row, "peak_gb": mem.peak_gb}


def compile_context():
    """Donated buffers let the compiled backward reuse its saved tensors' memory, which forbids
    running it twice on one graph (retain_graph) -- exactly what timing the backward alone does.
    The flag is read when the graph compiles, at its first call, hence around the whole sweep."""
    return torch._functorch.config.patch(donated_buffer=False)


# --- flash-bench: FlashAttention-2 in Triton against naive PyTorch and SDPA ------------------------


def attention_impls(dtype: torch.dtype, n: int, causal: bool) -> dict[str, Callable]:
    """The implementations measured side by side for one cell: name -> f(q, k, v) -> o."""
    mask = causal_mask(n, n, DEVICE) if causal else None

    def sdpa(backend):
        def run(q, k, v):
            with sdpa_kernel(backend):  # (B, N, D) -> one head
                return F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], is_causal=causal)[
                    :, 0
                ]

        return run

    impls = {"triton": lambda q, k, v: FlashAttentionTriton.apply(q, k, v, causal)}
    if GLUON_GPU and dtype != torch.float32:
        # The library's call ("auto") beside each of its kernel families pinned.
        impls["triton-only"] = lambda q, k, v: FlashAttentionTriton.apply(q, k, v, causal, "triton")
        impls["triton-gluon"] = lambda q, k, v: FlashAttentionTriton.apply(q, k, v, causal, "gluon")
        # dQ by the separate Triton pass instead of the Gluon kernel's reductions: run to run the same
        impls["triton-det"] = lambda q, k, v: FlashAttentionTriton.apply(q, k, v, causal, "auto", True)
    impls["naive"] = lambda q, k, v: naive_attention(q, k, v, mask)
    if not ON_GPU:
        impls["sdpa-math"] = sdpa(SDPA_BACKENDS["sdpa-math"])
    elif dtype == torch.float32:  # cuDNN and flash take only 16-bit inputs
        impls["sdpa-efficient"] = sdpa(SDPA_BACKENDS["sdpa-efficient"])
    else:
        impls["sdpa-cudnn"] = sdpa(SDPA_BACKENDS["sdpa-cudnn"])
        impls["sdpa-flash"] = sdpa(SDPA_BACKENDS["sdpa-flash"])
    return impls


def tolerance(dtype_name: str) -> float:
    """Largest relative error of O, dQ, dK, dV accepted before a cell is timed."""
    return 2e-2 if dtype_name == "fp32" else 5e-2


def _max_rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6)).item()


def flash_cells(
    batch: int, n: int, head_dim: int, dtype_name: str, causal: bool, budget: Budget
) -> Iterator[Cell]:
    """One (B, N, D, dtype) cell per implementation and pass: each implementation checked once
    against an fp32 reference on the same inputs, then timed forward, backward and forward+backward."""
    dtype = DTYPES[dtype_name]

    @functools.cache
    def inputs():
        q, k, v = random_qkv(batch, n, head_dim, dtype)
        grad_out = torch.randn_like(q)
        # Reference: SDPA's memory-efficient kernel in fp32 (it never materialises the N x N matrix).
        q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
        with torch.enable_grad(), sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION if ON_GPU else SDPBackend.MATH):
            o_ref = F.scaled_dot_product_attention(
                q32[:, None], k32[:, None], v32[:, None], is_causal=causal
            )[:, 0]
            grads_ref = torch.autograd.grad(o_ref, (q32, k32, v32), grad_out.float())
        return q, k, v, grad_out, (o_ref.detach(), *grads_ref)

    for variant, fn in attention_impls(dtype, n, causal).items():
        estimate = (
            naive_peak_bytes(batch, n, head_dim, dtype, causal, squares=5) if variant == "naive" else None
        )
        checked = functools.cache(functools.partial(_flash_check, fn, inputs, dtype_name, estimate))
        for pass_ in PASSES:
            extra = {} if estimate is None else {"mem_estimate_gb": estimate / 1e9}
            columns = _columns("flash", batch, n, head_dim, causal, pass_, **extra)
            run = functools.partial(
                _flash_pass, fn, inputs, checked, pass_, budget, (batch, n, head_dim, causal)
            )
            yield Cell(variant, _shape(batch, n, head_dim), dtype_name, run, columns)
        checked.cache_clear()
    inputs.cache_clear()
    if ON_GPU:
        torch.cuda.empty_cache()


def _flash_check(fn, inputs, dtype_name: str, estimate: int | None) -> dict:
    """Relative errors of O, dQ, dK, dV against the reference; a wrong answer raises."""
    if estimate is not None:  # the correctness pass's graph stays alive while fwd+bwd is timed
        _refuse_if_too_big(estimate)
    q, k, v, grad_out, expected = inputs()
    out = fn(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    errs = {
        f"err_{name}": _max_rel(got, want)
        for name, got, want in zip(("o", "dq", "dk", "dv"), (out, *grads), expected, strict=True)
    }
    check_close(f"relative errors {errs}", max(errs.values()), tolerance(dtype_name))
    return errs


def _flash_pass(fn, inputs, checked, pass_: str, budget: Budget, shape: tuple) -> dict:
    errs = checked()
    q, k, v, grad_out, _ = inputs()
    batch, n, head_dim, causal = shape
    with measure_peak_memory() as mem:
        if pass_ == "fwd":
            call = lambda: fn(q, k, v)
        elif pass_ == "bwd":
            out = fn(q, k, v)
            call = lambda: torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)
        else:
            call = lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), grad_out)
        row = timed(call, flops=attention_flops(batch, n, n, head_dim, causal, pass_), **budget.bench_kw())
    return {**errs, **row, "peak_gb": mem.peak_gb}


# --- the tile tuner: candidate tiles per kernel, timed on one shape --------------------------------


def tune_cells(
    batch: int, n: int, head_dim: int, dtype_name: str, causal: bool, budget: Budget, kernels
) -> Iterator[Cell]:
    """Each candidate tile of each Triton kernel on one shape (``impl="triton"`` throughout: the
    tiles are the Triton kernels'); the backward candidates are timed as the whole backward with the
    other kernel's tiles held at the table's choice."""
    dtype = DTYPES[dtype_name]

    @functools.cache
    def state():
        q, k, v = (t.detach() for t in random_qkv(batch, n, head_dim, dtype))
        grad_out = torch.randn_like(q)
        o_ref, lse = flash_forward(q, k, v, causal, impl="triton")
        return (
            q,
            k,
            v,
            grad_out,
            o_ref,
            lse,
            flash_backward(q, k, v, o_ref, lse, grad_out, causal, impl="triton"),
        )

    for kernel in kernels:
        table = tile_config(kernel, dtype, head_dim, causal)
        # The interpreter checks that the tuner runs, with the one tile it can afford.
        for cfg in TUNE_CANDIDATES[kernel] if ON_GPU else [table]:
            variant = f"{kernel} m{cfg.block_m} n{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}"
            columns = _columns("tune", batch, n, head_dim, causal, kernel, in_table=cfg == table)
            run = functools.partial(_tune_one, state, kernel, cfg, budget, (batch, n, head_dim, causal))
            yield Cell(variant, _shape(batch, n, head_dim), dtype_name, run, columns)
    state.cache_clear()


def _tune_one(state, kernel: str, cfg: TileConfig, budget: Budget, shape: tuple) -> dict:
    q, k, v, grad_out, o_ref, lse, grads_ref = state()
    batch, n, head_dim, causal = shape
    if kernel == "fwd":
        run = lambda: flash_forward(q, k, v, causal, config=cfg, impl="triton")
    elif kernel == "dq":
        run = lambda: flash_backward(q, k, v, o_ref, lse, grad_out, causal, dq_config=cfg, impl="triton")
    else:
        run = lambda: flash_backward(q, k, v, o_ref, lse, grad_out, causal, dkdv_config=cfg, impl="triton")
    want = (o_ref, lse) if kernel == "fwd" else grads_ref
    err = max(rel_err(a, b) for a, b in zip(run(), want, strict=True))
    check_close("relative error against the table's tiles", err, 1e-2)
    pass_ = "fwd" if kernel == "fwd" else "bwd"
    return timed(run, flops=attention_flops(batch, n, n, head_dim, causal, pass_), **budget.bench_kw())
