"""The benchmark: for each kernel, shape and pass, ours against eager, torch.compile and Liger-Kernel.

Every cell is checked before it is timed (relative error of outputs and gradients against the eager
function on fp32 copies of the inputs), then timed with ``common.bench`` (median, L2 flushed), and
its bytes -- each input read once, each output written once -- turned into GB/s and into a share
of the copy bandwidth measured in the same run on a ``clone()`` moving as many bytes.
"""

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch._functorch.config

import common
from common import ResultWriter, bench, failure_row, measure_peak_memory

from . import baselines
from .activations import gelu, swiglu
from .cross_entropy import cross_entropy
from .fp8 import quantize_fp8
from .rms_norm import rms_norm
from .rope import rope, rope_cache

KERNELS = ("rms_norm", "gelu", "swiglu", "rope", "cross_entropy", "fp8_row", "fp8_block")
VARIANTS = ("ours", "eager", "compile", "liger")
PASSES = ("fwd", "bwd", "fwd+bwd")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# (tokens, width) per kernel; rope's width is heads x head_dim of q (k has a quarter of the heads).
SHAPES = {
    "quick": {
        "rms_norm": [(8192, 4096), (65536, 8192)],
        "gelu": [(8192, 4096), (65536, 8192)],
        "swiglu": [(8192, 4096), (65536, 8192)],
        "rope": [(8192, 4096), (65536, 4096)],
        "cross_entropy": [(4096, 32000), (16384, 128256)],
        "fp8_row": [(8192, 4096), (65536, 8192)],
        "fp8_block": [(8192, 4096), (65536, 8192)],
    },
    "full": {
        "rms_norm": [(4096, 1024), (8192, 4096), (16384, 4096), (32768, 8192), (65536, 8192)],
        "gelu": [(4096, 1024), (8192, 4096), (32768, 8192), (65536, 8192)],
        "swiglu": [(4096, 1024), (8192, 4096), (32768, 8192), (65536, 8192)],
        "rope": [(4096, 1024), (8192, 4096), (32768, 4096), (65536, 4096)],
        "cross_entropy": [(4096, 32000), (16384, 32000), (4096, 128256), (16384, 128256)],
        "fp8_row": [(4096, 1024), (8192, 4096), (32768, 8192), (65536, 8192)],
        "fp8_block": [(4096, 1024), (8192, 4096), (32768, 8192), (65536, 8192)],
    },
    # The interpreter: odd sizes, a few hundred elements.
    "cpu": {
        "rms_norm": [(7, 123)],
        "gelu": [(7, 123)],
        "swiglu": [(7, 123)],
        "rope": [(10, 48)],
        "cross_entropy": [(5, 300)],
        "fp8_row": [(7, 256)],
        "fp8_block": [(7, 256)],
    },
}
ROPE_HEAD_DIM = 128 if common.ON_GPU else 8
# bf16 outputs carry a relative rounding error of at most 2**-9 per element. e4m3 keeps 3 mantissa
# bits: at most 2**-4 per element, about 2.6% rms on normal data (measured).
TOLERANCE = {"fp8_row": 0.04, "fp8_block": 0.04}
DEFAULT_TOLERANCE = 1e-2


@dataclass
class Case:
    """One kernel at one shape: inputs, what is differentiated, bytes moved per pass, the functions."""

    kernel: str
    tokens: int
    width: int
    args: list
    grad_outs: list | None  # None: the output is a scalar loss (or has no gradient)
    bytes: dict
    functions: dict = field(default_factory=dict)  # variant -> callable, or the reason it is skipped
    passes: tuple = PASSES

    @property
    def shape(self) -> str:
        return f"{self.tokens}x{self.width}"

    def diff_args(self, args) -> list:
        return [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]


def _randn(*shape, dtype, requires_grad=False):
    return torch.randn(*shape, device=common.DEVICE, dtype=dtype).requires_grad_(requires_grad)


def _pass_bytes(fwd: int, bwd: int) -> dict[str, int]:
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}


def make_case(kernel: str, tokens: int, width: int, dtype: torch.dtype, liger: dict) -> Case:
    if kernel not in KERNELS:
        raise ValueError(f"kernel: unknown {kernel!r}; expected one of {', '.join(KERNELS)}")
    b = torch.finfo(dtype).bits // 8
    elems = tokens * width
    ours = {
        "rms_norm": rms_norm,
        "gelu": gelu,
        "swiglu": swiglu,
        "rope": rope,
        "cross_entropy": cross_entropy,
        "fp8_row": functools.partial(quantize_fp8, granularity="row"),
        "fp8_block": functools.partial(quantize_fp8, granularity="block", block=128),
    }
    passes, compiled, liger_fn = PASSES, None, liger[kernel]
    if kernel in ("rms_norm", "gelu", "swiglu"):
        # Row-wise or elementwise: outputs and upstream gradients of the input's shape.
        if kernel == "rms_norm":
            args = [
                _randn(tokens, width, dtype=dtype, requires_grad=True),
                (1 + 0.1 * _randn(width, dtype=torch.float32)).to(dtype).requires_grad_(),
            ]
            fwd = 2 * elems * b + width * b + tokens * 4
            bwd = 3 * elems * b + 2 * width * b + tokens * 4
            eager = baselines.rms_norm_eager
        else:
            n_in = 1 if kernel == "gelu" else 2
            args = [_randn(tokens, width, dtype=dtype, requires_grad=True) for _ in range(n_in)]
            fwd, bwd = (n_in + 1) * elems * b, (2 * n_in + 1) * elems * b
            eager = baselines.gelu_eager if kernel == "gelu" else baselines.swiglu_eager
        grad_outs, nbytes = [_randn(tokens, width, dtype=dtype)], _pass_bytes(fwd, bwd)
    elif kernel == "rope":
        d = ROPE_HEAD_DIM
        heads = width // d
        kv_heads = max(1, heads // 4)
        seq = min(tokens, 4096)
        batch = tokens // seq
        q = _randn(batch, seq, heads, d, dtype=dtype, requires_grad=True)
        k = _randn(batch, seq, kv_heads, d, dtype=dtype, requires_grad=True)
        cos, sin = rope_cache(seq, d)
        moved = 2 * (q.numel() + k.numel()) * b + 2 * cos.numel() * 4
        args, nbytes = [q, k, cos, sin], _pass_bytes(moved, moved)
        grad_outs = [_randn(*q.shape, dtype=dtype), _randn(*k.shape, dtype=dtype)]
        # eager and Liger take the Hugging Face layout: cos/sin of (T, D), duplicated halves, in x's dtype
        cos_full, sin_full = torch.cat([cos, cos], -1).to(dtype), torch.cat([sin, sin], -1).to(dtype)
        eager = lambda q, k, c, s: baselines.rope_eager(q, k, cos_full, sin_full)
        compiled = _compiled(baselines.rope_eager, cos_full, sin_full)
        if not isinstance(liger_fn, str):
            liger_fn = lambda q, k, c, s: liger["rope"](q, k, cos_full, sin_full)
    elif kernel == "cross_entropy":
        logits = _randn(tokens, width, dtype=dtype, requires_grad=True)
        target = torch.randint(0, width, (tokens,), device=common.DEVICE)
        target[::97] = -100  # a few ignored positions (padding)
        args, grad_outs, nbytes = [logits, target], None, {"fwd+bwd": 2 * elems * b + tokens * 8}
        # The gradient is computed in our forward, so only forward+backward compares like with like.
        passes = ("fwd+bwd",)
        eager = baselines.cross_entropy_eager
    else:  # fp8_row, fp8_block
        granularity = kernel.removeprefix("fp8_")
        x = _randn(tokens, width, dtype=dtype)
        n_scales = tokens * (1 if granularity == "row" else width // 128)
        args, grad_outs, nbytes = [x], None, {"fwd": elems * b + elems + n_scales * 4}
        passes = ("fwd",)
        eager = functools.partial(baselines.fp8_eager, granularity=granularity, block=128)
    functions = {
        "ours": ours[kernel],
        "eager": eager,
        "compile": compiled or _compiled(eager),
        "liger": liger_fn,
    }
    return Case(kernel, tokens, width, args, grad_outs, nbytes, functions, passes)


@functools.cache
def _compiled_fn(fn):
    # Donated buffers would forbid the second backward (retain_graph) the "bwd" timer runs.
    torch._functorch.config.donated_buffer = False
    return torch.compile(fn, dynamic=False)


def _compiled(fn, *extra):
    compiled = _compiled_fn(fn)
    if extra:  # rope: the HF-layout cos/sin replace ours
        return lambda q, k, c, s: compiled(q, k, *extra)
    return compiled


def _outputs(out) -> list:
    return list(out) if isinstance(out, tuple | list) else [out]


def run_once(case: Case, fn: Callable, args: list):
    """Outputs and gradients (fwd+bwd) of ``fn`` on ``args``."""
    outs = _outputs(fn(*args))
    diff = case.diff_args(args)
    if not diff:
        return outs, []
    grads = torch.autograd.grad([o for o in outs if o.requires_grad], diff, case.grad_outs)
    return outs, list(grads)


def reference(case: Case):
    """The eager function on fp32 copies of the inputs (fp8 quantisation: the input itself, dequantised
    outputs are compared to it)."""
    if case.kernel.startswith("fp8"):
        return [case.args[0].float()], []
    args = [
        a.detach().float().requires_grad_(a.requires_grad) if a.is_floating_point() else a for a in case.args
    ]
    eager = case.functions["eager"]
    outs = _outputs(eager(*args))
    diff = case.diff_args(args)
    grads = torch.autograd.grad(outs, diff, [g.float() for g in case.grad_outs] if case.grad_outs else None)
    return [o.detach() for o in outs], list(grads)


def relative_error(case: Case, got, ref) -> float:
    outs, grads = got
    if case.kernel.startswith("fp8"):
        q, scales = outs
        group = 128 if case.kernel == "fp8_block" else case.width
        deq = q.float() * scales.float().repeat_interleave(group, dim=-1)
        outs = [deq]
    errs = [
        ((a.float() - b.float()).norm() / b.float().norm()).item()
        for a, b in zip([*outs, *grads], [*ref[0], *ref[1]], strict=False)
    ]
    return max(errs) if all(e == e for e in errs) else float("nan")


def _fresh(args: list) -> list:
    """Copies, so an implementation that writes into its inputs (Liger does) spoils nobody else's."""
    return [
        a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args
    ]


def _timers(case: Case, fn: Callable, args: list) -> dict[str, Callable]:
    diff = case.diff_args(args)

    def fwd_bwd():
        outs = _outputs(fn(*args))
        return torch.autograd.grad([o for o in outs if o.requires_grad], diff, case.grad_outs)

    timers = {"fwd": lambda: fn(*args), "fwd+bwd": fwd_bwd}
    if "bwd" in case.passes:
        kept = [o for o in _outputs(fn(*args)) if o.requires_grad]
        timers["bwd"] = lambda: torch.autograd.grad(kept, diff, case.grad_outs, retain_graph=True)
    return {p: timers[p] for p in case.passes}


def host_and_device_ms(fn: Callable, calls: int = 20) -> tuple[float, float]:
    """What one call costs the CPU (Python, autograd, launches; the GPU is not waited for) and the GPU
    (the sum of its kernels' durations, from the profiler). When the first is the larger, the cell is
    bound by the host, not by the kernels -- at small shapes, a CUDA graph or a compiled region would
    hide it. NaN where the profiler is not available."""
    if not common.ON_GPU:
        return float("nan"), float("nan")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host_ms = (time.perf_counter() - start) * 1e3 / calls
    torch.cuda.synchronize()
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        device_ms = sum(e.self_device_time_total for e in kernels) / 1e3 / calls
    except Exception:  # the profiler is optional evidence, never a reason to lose the cell
        device_ms = float("nan")
    return host_ms, device_ms


_COPY_GBPS: dict[int, float] = {}


def copy_gbps(nbytes: int, bench_kw: dict) -> float:
    """GB/s of a device copy (``clone()``) that reads and writes ``nbytes`` in all."""
    if nbytes not in _COPY_GBPS:
        src = torch.randn(max(nbytes // 4, 1), device=common.DEVICE, dtype=torch.bfloat16)
        _COPY_GBPS[nbytes] = nbytes / bench(src.clone, **bench_kw).ms / 1e6
    return _COPY_GBPS[nbytes]


def run_case(case: Case, variants, passes, writer: ResultWriter, bench_kw: dict, dtype_name: str) -> None:
    ref = reference(case)
    tol = TOLERANCE.get(case.kernel, DEFAULT_TOLERANCE)
    inputs_gb = sum(a.numel() * a.element_size() for a in case.args if isinstance(a, torch.Tensor)) / 1e9
    for variant in variants:
        fn = case.functions[variant]
        base = {
            "variant": variant,
            "shape": case.shape,
            "dtype": dtype_name,
            "kernel": case.kernel,
            "tokens": case.tokens,
            "width": case.width,
        }
        label = f"  {case.kernel:13s} {case.shape:>13s} {variant:8s}"
        if isinstance(fn, str):
            writer.write({**base, "pass": "all", "status": "skipped", "error": fn})
            print(f"{label} skipped: {fn}")
            continue
        args = _fresh(case.args)
        try:
            err = relative_error(case, run_once(case, fn, args), ref)
            if not err <= tol:
                raise AssertionError(f"relative error {err:.3g} above {tol:g}: not timed")
            with measure_peak_memory() as mem:
                run_once(case, fn, args)
            extra_gb = (mem.peak_bytes - mem.start_bytes) / 1e9
            timers = _timers(case, fn, args)
        except Exception as exc:  # a failed cell is a row, and the sweep goes on
            row = writer.write({**base, "pass": "all", **failure_row(exc)})
            print(f"{label} {row['status']}: {row['error'][:150]}")
            continue
        for name in passes:
            if name not in timers:
                continue
            try:
                timing = bench(timers[name], **bench_kw)
            except Exception as exc:
                row = writer.write({**base, "pass": name, **failure_row(exc)})
                print(f"{label} {name:8s} {row['status']}: {row['error'][:150]}")
                continue
            host_ms, device_ms = host_and_device_ms(timers[name])
            nbytes = case.bytes[name]
            gbps = nbytes / timing.ms / 1e6
            copy = copy_gbps(nbytes, bench_kw)
            writer.write(
                {
                    **base,
                    "pass": name,
                    **timing.as_row(),
                    "bytes": nbytes,
                    "gbps": gbps,
                    "copy_gbps": copy,
                    "pct_copy": 100 * gbps / copy,
                    "rel_err": err,
                    "extra_mem_gb": extra_gb,
                    "inputs_gb": inputs_gb,
                    "host_ms": host_ms,
                    "device_ms": device_ms,
                }
            )
            print(
                f"{label} {name:8s} {timing.ms:9.4f} ms "
                f"{gbps:8.1f} GB/s ({100 * gbps / copy:5.1f}% of copy)  err {err:.1e}  +{extra_gb:.2f} GB  "
                f"host {host_ms:.3f} / device {device_ms:.3f} ms"
            )
        del args, timers
    del ref


def run(kernels, variants, passes, size: str, writer: ResultWriter, dtype_name: str, bench_kw: dict) -> None:
    liger = baselines.liger_ops(KERNELS) if "liger" in variants else dict.fromkeys(KERNELS, "not requested")
    dtype = DTYPES[dtype_name]
    for kernel in kernels:
        for tokens, width in SHAPES[size][kernel]:
            try:
                case = make_case(kernel, tokens, width, dtype, liger)
                run_case(case, variants, passes, writer, bench_kw, dtype_name)
            except Exception as exc:
                writer.write(
                    {
                        "variant": "all",
                        "shape": f"{tokens}x{width}",
                        "dtype": dtype_name,
                        "kernel": kernel,
                        "pass": "all",
                        **failure_row(exc),
                    }
                )
                print(f"  {kernel} {tokens}x{width}: {exc}")
            finally:
                case = None
                if common.ON_GPU:
                    torch.cuda.empty_cache()
