"""The three benchmarks of this phase, and the tile tuner. Each cell writes one CSV row per
implementation and pass; a cell that runs out of memory (or would, by arithmetic) becomes a row
marked ``oom`` and the sweep goes on."""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from common import DEVICE, ON_GPU, OutOfMemory, ResultWriter, bench, failure_row, measure_peak_memory

from .flash_triton import (
    INTERPRETER_CONFIGS,
    FlashAttentionTriton,
    TileConfig,
    flash_backward,
    flash_forward,
    tile_config,
)
from .reference import attention_flops, causal_mask, naive_attention

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SDPA_BACKENDS = {
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa-math": SDPBackend.MATH,
}
GOAL_SHAPE = (16, 16384, 64)  # (B, N, D): causal bf16 forward+backward, the leaderboard shape


@dataclass(frozen=True)
class Budget:
    """How long each timing runs: exactly ``passes`` timed calls, or a time budget (``--quick``)."""

    passes: int | None
    warmup_ms: float = 100.0
    rep_ms: float = 500.0

    def time(self, fn: Callable[[], object]):
        if self.passes is not None:
            return bench(fn, warmup_ms=self.warmup_ms, min_reps=self.passes, max_reps=self.passes)
        return bench(fn, warmup_ms=self.warmup_ms, rep_ms=self.rep_ms, min_reps=3, max_reps=100)


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


def device_bytes() -> int:
    return torch.cuda.get_device_properties(0).total_memory if ON_GPU else 0


def _mb(x: int) -> float:
    return x / 1e9


def _cell(bench_name: str, batch: int, n: int, head_dim: int, dtype_name: str, causal: bool, **first) -> dict:
    """The columns every row of a cell shares; ``first`` (e.g. the variant) goes right after ``bench``."""
    return {
        "bench": bench_name,
        **first,
        "shape": f"B={batch} N={n} D={head_dim}",
        "dtype": dtype_name,
        "batch": batch,
        "seq": n,
        "head_dim": head_dim,
        "causal": causal,
    }


def _skip_if_too_big(writer: ResultWriter, row: dict, estimate: int, label: str) -> bool:
    """Record the cell as ``oom`` without running it when its estimated peak exceeds the card."""
    if not (ON_GPU and estimate > device_bytes()):
        return False
    writer.write(
        {
            **row,
            "status": "oom",
            "error": f"not run: estimated peak {_mb(estimate):.1f} GB > {_mb(device_bytes()):.1f} GB",
        }
    )
    print(f"{label}  oom (estimated {_mb(estimate):.1f} GB)")
    return True


def _tflops(batch: int, n: int, head_dim: int, causal: bool, pass_: str, ms: float) -> float:
    return attention_flops(batch, n, n, head_dim, causal, pass_) / (ms * 1e-3) / 1e12


# ----------------------------------------------------------------------------------------------
# attention-bench and compile-bench: naive attention, eager or compiled, forward and backward
# ----------------------------------------------------------------------------------------------


def _naive_cell(
    writer: ResultWriter,
    bench_name: str,
    variant: str,
    fn,
    batch: int,
    n: int,
    head_dim: int,
    dtype_name: str,
    budget: Budget,
    reference=None,
) -> None:
    dtype = DTYPES[dtype_name]
    cell = _cell(bench_name, batch, n, head_dim, dtype_name, False, variant=variant)
    estimate = naive_peak_bytes(batch, n, head_dim, dtype, causal=False)
    cell["mem_estimate_gb"] = _mb(estimate)
    label = f"  {bench_name:15s} {variant:8s} {cell['shape']:22s} {dtype_name}"
    if _skip_if_too_big(writer, {**cell, "pass": "fwd"}, estimate, label):
        return
    try:
        with measure_peak_memory() as mem:
            q, k, v = random_qkv(batch, n, head_dim, dtype)
            out = fn(q, k, v)
            extra = {}
            if reference is not None:  # the compiled function must give eager's answer
                expected = reference(q, k, v)
                extra["max_err_vs_eager"] = (out - expected).abs().max().item()
                del expected
            fwd = budget.time(lambda: fn(q, k, v))
            mem_before_bwd = torch.cuda.memory_allocated() if ON_GPU else 0
            grad_out = torch.randn_like(out)
            bwd = budget.time(lambda: torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True))
    except (OutOfMemory, RuntimeError) as err:
        row = writer.write({**cell, "pass": "fwd", **failure_row(err)})
        print(f"{label}  {row['status']}: {row['error'][:100]}")
        return
    for pass_, timing in (("fwd", fwd), ("bwd", bwd)):
        writer.write(
            {
                **cell,
                **extra,
                "pass": pass_,
                **timing.as_row(),
                "mem_before_bwd_gb": _mb(mem_before_bwd),
                "peak_gb": mem.peak_gb,
            }
        )
    print(
        f"{label}  fwd {fwd.ms:8.3f} ms  bwd {bwd.ms:8.3f} ms  before bwd {_mb(mem_before_bwd):6.2f} GB  "
        f"peak {mem.peak_gb:6.2f} GB"
    )


def _naive_grid(head_dims, seqs):
    """(head_dim, n) over the grid; the allocator's cache is emptied after each cell, since the
    largest naive cells come close to filling the card."""
    for head_dim in head_dims:
        for n in seqs:
            yield head_dim, n
            if ON_GPU:
                torch.cuda.empty_cache()


def attention_bench(writer: ResultWriter, *, head_dims, seqs, batch: int, dtype_name: str, budget: Budget):
    """Naive attention (einsum, softmax, einsum), forward and backward, memory before the backward."""
    for head_dim, n in _naive_grid(head_dims, seqs):
        _naive_cell(writer, "attention", "naive", naive_attention, batch, n, head_dim, dtype_name, budget)


def compile_bench(writer: ResultWriter, *, head_dims, seqs, batch: int, dtype_name: str, budget: Budget):
    """The same grid for torch.compile'd naive attention against eager, side by side per cell.

    ``dynamic=True`` compiles one graph for every shape; per-shape graphs would spend more time
    compiling than the whole grid spends running.
    """
    compiled = torch.compile(naive_attention, dynamic=True)
    # Donated buffers let the compiled backward reuse its saved tensors' memory, which forbids
    # running it twice on one graph (retain_graph) -- exactly what timing the backward alone does.
    # The flag is read when the graph compiles, at its first call, hence around the whole loop.
    with torch._functorch.config.patch(donated_buffer=False):
        for head_dim, n in _naive_grid(head_dims, seqs):
            for variant, fn, ref in (
                ("eager", naive_attention, None),
                ("compile", compiled, naive_attention),
            ):
                _naive_cell(writer, "compile", variant, fn, batch, n, head_dim, dtype_name, budget, ref)


# ----------------------------------------------------------------------------------------------
# flash-bench: FlashAttention-2 in Triton against naive PyTorch and SDPA
# ----------------------------------------------------------------------------------------------


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

    impls = {
        "triton": lambda q, k, v: FlashAttentionTriton.apply(q, k, v, causal),
        "naive": lambda q, k, v: naive_attention(q, k, v, mask),
    }
    if not ON_GPU:
        impls["sdpa-math"] = sdpa(SDPA_BACKENDS["sdpa-math"])
    elif dtype == torch.float32:  # cuDNN and flash take only 16-bit inputs
        impls["sdpa-efficient"] = sdpa(SDPA_BACKENDS["sdpa-efficient"])
    else:
        impls["sdpa-cudnn"] = sdpa(SDPA_BACKENDS["sdpa-cudnn"])
        impls["sdpa-flash"] = sdpa(SDPA_BACKENDS["sdpa-flash"])
    return impls


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6)).item()


def _check_then_time(fn, q, k, v, grad_out, expected, tolerance: float, budget: Budget):
    """Relative errors of O, dQ, dK, dV against ``expected`` (a wrong answer raises before any
    timing), then the forward, backward-only and forward+backward timings."""
    out = fn(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)
    names = ("o", "dq", "dk", "dv")
    errs = {
        f"err_{name}": _rel_err(got, want)
        for name, got, want in zip(names, (out, *grads), expected, strict=True)
    }
    del grads
    if max(errs.values()) > tolerance:
        raise RuntimeError(f"wrong answer: relative errors {errs} exceed {tolerance}")
    timings = {
        "fwd": budget.time(lambda: fn(q, k, v)),
        "bwd": budget.time(lambda: torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)),
        "fwd+bwd": budget.time(lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), grad_out)),
    }
    return errs, timings


def flash_cell(
    writer: ResultWriter,
    batch: int,
    n: int,
    head_dim: int,
    dtype_name: str,
    causal: bool,
    budget: Budget,
    tolerance: float,
) -> None:
    """One (B, N, D, dtype) cell: every implementation checked against an fp32 reference on the same
    inputs, then timed forward, backward and forward+backward."""
    dtype = DTYPES[dtype_name]
    cell = _cell("flash", batch, n, head_dim, dtype_name, causal)
    shape = cell["shape"]
    q, k, v = random_qkv(batch, n, head_dim, dtype)
    grad_out = torch.randn_like(q)
    # Reference: SDPA's memory-efficient kernel in fp32 (it never materialises the N x N matrix).
    with torch.no_grad():
        q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    with torch.enable_grad(), sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION if ON_GPU else SDPBackend.MATH):
        o_ref = F.scaled_dot_product_attention(q32[:, None], k32[:, None], v32[:, None], is_causal=causal)[
            :, 0
        ]
        grads_ref = torch.autograd.grad(o_ref, (q32, k32, v32), grad_out.float())
    for variant, fn in attention_impls(dtype, n, causal).items():
        label = f"  flash {variant:15s} {shape:22s} {dtype_name}"
        base = {**cell, "variant": variant}
        if variant == "naive":
            # Five squares: the correctness pass's graph stays alive while fwd+bwd is timed.
            estimate = naive_peak_bytes(batch, n, head_dim, dtype, causal, squares=5)
            base["mem_estimate_gb"] = _mb(estimate)
            if _skip_if_too_big(writer, {**base, "pass": "fwd+bwd"}, estimate, label):
                continue
        try:
            with measure_peak_memory() as mem:
                errs, timings = _check_then_time(
                    fn, q, k, v, grad_out, (o_ref, *grads_ref), tolerance, budget
                )
        except (OutOfMemory, RuntimeError) as err:
            row = writer.write({**base, "pass": "fwd+bwd", **failure_row(err)})
            print(f"{label}  {row['status']}: {row['error'][:160]}")
            if ON_GPU:
                torch.cuda.empty_cache()
            continue
        parts = []
        for pass_, timing in timings.items():
            tflops = _tflops(batch, n, head_dim, causal, pass_, timing.ms)
            writer.write(
                {**base, **errs, "pass": pass_, **timing.as_row(), "tflops": tflops, "peak_gb": mem.peak_gb}
            )
            parts.append(f"{pass_} {timing.ms:8.3f} ms {tflops:6.1f} TF/s")
        print(f"{label}  " + "  ".join(parts) + f"  peak {mem.peak_gb:.2f} GB  err {max(errs.values()):.1e}")
    if ON_GPU:
        torch.cuda.empty_cache()


def _tolerance(dtype_name: str) -> float:
    """Largest relative error of O, dQ, dK, dV accepted before a cell is timed."""
    return 2e-2 if dtype_name == "fp32" else 5e-2


def flash_bench(
    writer: ResultWriter, *, head_dims, seqs, dtype_name: str, causal: bool, budget: Budget, tokens: int
) -> None:
    """The (seq x d) grid in one dtype at ``tokens`` tokens per batch (B = tokens // N, at least 1)."""
    for head_dim in head_dims:
        for n in seqs:
            flash_cell(
                writer, max(1, tokens // n), n, head_dim, dtype_name, causal, budget, _tolerance(dtype_name)
            )


def goal_bench(writer: ResultWriter, budget: Budget) -> None:
    """The fixed goal shape: causal bf16 forward+backward."""
    batch, n, head_dim = GOAL_SHAPE
    flash_cell(writer, batch, n, head_dim, "bf16", True, budget, _tolerance("bf16"))


# ----------------------------------------------------------------------------------------------
# The tile tuner: candidate tiles per kernel, timed on one shape (its results fill GPU_CONFIGS)
# ----------------------------------------------------------------------------------------------

TUNE_CANDIDATES = {
    # Forward: phase 02's best two d = 64 tiles with TMA loads, the block-pointer kernel's old picks,
    # and neighbours; 64 x 64 and 128 x 64 at 8 warps are the d = 128 contenders. Tiles that do not
    # fit the shared memory at a head dim fail and are written as failed rows.
    "fwd": [
        TileConfig(128, 128, 4, 3),
        TileConfig(128, 64, 8, 3),
        TileConfig(128, 64, 4, 3),
        TileConfig(128, 128, 4, 2),
        TileConfig(128, 128, 8, 3),
        TileConfig(64, 64, 4, 3),
        TileConfig(64, 64, 4, 2),
        TileConfig(128, 64, 8, 2),
        TileConfig(128, 128, 8, 2),
    ],
    "dq": [
        TileConfig(128, 64, 8, 2),
        TileConfig(128, 64, 4, 3),
        TileConfig(128, 32, 4, 3),
        TileConfig(64, 64, 4, 3),
        TileConfig(128, 128, 8, 2),
        TileConfig(128, 64, 8, 3),
        TileConfig(64, 64, 8, 3),
    ],
    "dkdv": [
        TileConfig(64, 128, 8, 2),
        TileConfig(32, 128, 4, 3),
        TileConfig(64, 128, 4, 3),
        TileConfig(64, 64, 4, 3),
        TileConfig(128, 128, 8, 2),
        TileConfig(32, 64, 4, 4),
        TileConfig(32, 64, 4, 3),
        TileConfig(64, 64, 8, 3),
    ],
}


def tune(
    writer: ResultWriter,
    batch: int,
    n: int,
    head_dim: int,
    dtype_name: str,
    causal: bool,
    budget: Budget,
    kernels=("fwd", "dq", "dkdv"),
) -> None:
    """Time each candidate tile of each kernel on one shape; the backward candidates are timed as the
    whole backward with the other kernel's tiles held at the table's choice."""
    dtype = DTYPES[dtype_name]
    q, k, v = random_qkv(batch, n, head_dim, dtype)
    q, k, v = q.detach(), k.detach(), v.detach()
    grad_out = torch.randn_like(q)
    o_ref, lse = flash_forward(q, k, v, causal)
    grads_ref = flash_backward(q, k, v, o_ref, lse, grad_out, causal)
    for kernel in kernels:
        # The interpreter checks that the tuner runs, with the one tile it can afford.
        for cfg in TUNE_CANDIDATES[kernel] if ON_GPU else [INTERPRETER_CONFIGS[kernel]]:
            variant = f"{kernel} m{cfg.block_m} n{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}"
            cell = {**_cell("tune", batch, n, head_dim, dtype_name, causal, variant=variant), "pass": kernel}
            if kernel == "fwd":
                run = lambda cfg=cfg: flash_forward(q, k, v, causal, config=cfg)
            elif kernel == "dq":
                run = lambda cfg=cfg: flash_backward(q, k, v, o_ref, lse, grad_out, causal, dq_config=cfg)
            else:
                run = lambda cfg=cfg: flash_backward(q, k, v, o_ref, lse, grad_out, causal, dkdv_config=cfg)
            try:
                got = run()
                want = (o_ref, lse) if kernel == "fwd" else grads_ref
                err = max(_rel_err(a, b) for a, b in zip(got, want, strict=True))
                if err > 1e-2:
                    raise RuntimeError(f"wrong answer: relative error {err:.2e} against the table's tiles")
                timing = budget.time(run)
            except Exception as err:  # e.g. triton.runtime.errors.OutOfResources: too much shared memory
                row = writer.write({**cell, **failure_row(err)})
                print(f"  tune {variant:26s} {row['status']}: {row['error'][:100]}")
                continue
            pass_ = "fwd" if kernel == "fwd" else "bwd"
            tflops = _tflops(batch, n, head_dim, causal, pass_, timing.ms)
            table = cfg == tile_config(kernel, dtype, head_dim, causal)
            writer.write({**cell, **timing.as_row(), "tflops": tflops, "in_table": table})
            print(
                f"  tune {variant:26s} {cell['shape']}  {timing.ms:8.3f} ms  {tflops:6.1f} TF/s ({pass_})"
                + ("  <- table" if table else "")
            )
