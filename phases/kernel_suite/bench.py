"""kernel_suite's cells: each op, size and pass -- ours against eager, torch.compile and Liger-Kernel.

Every cell is checked before it is timed (relative error of outputs and gradients against the eager
function on fp32 copies of the inputs), then timed with ``common.runner.timed`` (median, L2 flushed);
its bytes -- each input read once, each output written once -- become GB/s and a share of the copy
bandwidth measured in the same run on a ``clone()`` moving as many bytes. ``host_ms`` / ``device_ms``
say whether a cell measures the kernels or the host's launch path.

``tune_cells`` are the launch-setting sweeps of the two kernels with settings to choose
(cross-entropy's block bytes, warps and rows in flight; RMSNorm backward's warps per SM and pipeline
depth): ``python -m phases kernel_suite --tune`` writes them to ``data/kernel_suite/tune/``.
"""

import dataclasses
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch._functorch.config
import torch.nn.functional as F

from common import DEVICE, ON_GPU, Cell, bench, check_close, measure_peak_memory, timed
from common.runner import timing_row
from common.timing import bench_interleaved, host_and_device_ms
from tritonlab.ops import (
    FP8_DTYPE,
    FP8_MAX,
    cross_entropy,
    fused_linear_cross_entropy,
    geglu,
    gelu,
    quantize_fp8,
    rms_norm,
    rope,
    rope_cache,
    swiglu,
)
from tritonlab.ops.cross_entropy import (
    DEFAULT_SETTINGS,
    SHORT_ROW_SETTINGS,
    SOFTCAP_SHORT_ROW_SETTINGS,
    CrossEntropyFunction,
    CrossEntropyOptions,
    CrossEntropySettings,
)
from tritonlab.ops.rms_norm import RMSNormFunction, RMSNormSettings
from tritonlab.testing import DTYPES, rel_err

from .names import CE_OPTION_SETS, KERNELS

try:  # optional: `uv sync --extra liger`; without it Liger's cells are rows saying so
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
    from liger_kernel.ops.geglu import LigerGELUMulFunction
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.ops.rope import LigerRopeFunction
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    LIGER_MISSING = None
except (ImportError, RuntimeError) as err:  # not installed, or a Triton/driver error on import
    LIGER_MISSING = f"liger-kernel not importable ({type(err).__name__}: {err})"[:200]

VARIANTS = ("ours", "ours-unchecked", "eager", "compile", "liger")
# The losses that wait, once per call, for a count of out-of-range targets read back to the host;
# "ours-unchecked" times them with check_targets=False, to show what that wait costs where the host
# is the bound (small sizes). The fused linear cross-entropy waits once per call too, behind GEMMs
# of tens of milliseconds: not offered there.
TARGET_CHECKED = ("cross_entropy", *CE_OPTION_SETS)
# Kernels whose variants are timed in alternating rounds (common.timing.bench_interleaved), not one
# after another: the fused linear cross-entropy's GEMMs hold an H100 at its 700 W limit, where the
# clock follows the load before it and order alone moved ours against compile from 0.99x
# (alternating) to 1.05x (ours first; flce_clocks diagnostic).
INTERLEAVED = {"fused_linear_cross_entropy": 3}
PASSES = ("fwd", "bwd", "fwd+bwd")

# (tokens, width) per kernel and size set; rope's width is heads x head_dim of q (k has a quarter
# of the heads). `tiny` is what the interpreter runs: odd sizes, a few hundred elements.
SIZES = {
    "tiny": {
        "rms_norm": [(7, 123)],
        "gelu": [(7, 123)],
        "swiglu": [(7, 123)],
        "geglu": [(7, 123)],
        "rope": [(10, 48)],
        "cross_entropy": [(5, 300)],
        "cross_entropy_options": [(5, 300)],
        "fused_linear_cross_entropy": [(5, 300)],
        "fp8_row": [(7, 256)],
        "fp8_block": [(7, 256)],
    },
    "quick": {
        "rms_norm": [(8192, 4096), (65536, 8192)],
        "gelu": [(8192, 4096), (65536, 8192)],
        "swiglu": [(8192, 4096), (65536, 8192)],
        "geglu": [(8192, 4096), (65536, 8192)],
        "rope": [(8192, 4096), (65536, 4096)],
        "cross_entropy": [(4096, 32000), (16384, 128256)],
        "cross_entropy_options": [(4096, 32000), (16384, 128256)],
        "fused_linear_cross_entropy": [(8192, 32000), (16384, 128256)],
        "fp8_row": [(8192, 4096), (65536, 8192)],
        "fp8_block": [(8192, 4096), (65536, 8192)],
    },
    "full": {
        "rms_norm": [(4096, 1024), (8192, 4096), (16384, 4096), (32768, 8192), (65536, 8192)],
        "gelu": [(4096, 1024), (8192, 4096), (32768, 8192), (65536, 8192)],
        "swiglu": [(4096, 1024), (8192, 4096), (32768, 8192), (65536, 8192)],
        "geglu": [(4096, 1024), (8192, 4096), (32768, 8192), (65536, 8192)],
        "rope": [(4096, 1024), (8192, 4096), (32768, 4096), (65536, 4096)],
        # 50 257 (GPT-2's vocabulary): rows that are not a multiple of 16 bytes
        "cross_entropy": [(4096, 32000), (16384, 32000), (8192, 50257), (4096, 128256), (16384, 128256)],
        "cross_entropy_options": [(4096, 32000), (16384, 32000), (8192, 50257), (16384, 128256)],
        "fused_linear_cross_entropy": [(8192, 32000), (8192, 128256), (16384, 128256)],
        "fp8_row": [(4096, 1024), (8192, 4096), (32768, 8192), (65536, 8192)],
        "fp8_block": [(4096, 1024), (8192, 4096), (32768, 8192), (65536, 8192)],
    },
}
for _sizes in SIZES.values():  # each option alone at the sizes of all of them at once
    for _kernel in CE_OPTION_SETS:
        _sizes.setdefault(_kernel, _sizes["cross_entropy_options"])
ROPE_HEAD_DIM = 128 if ON_GPU else 8
# fused_linear_cross_entropy's sizes are (tokens, vocabulary); the hidden width is this.
FLCE_HIDDEN = 4096 if ON_GPU else 13
# bf16 outputs carry a relative rounding error of at most 2**-9 per element. e4m3 keeps 3 mantissa
# bits: at most 2**-4 per element, about 2.6% rms on normal data (measured).
TOLERANCE = {"fp8_row": 0.04, "fp8_block": 0.04}
DEFAULT_TOLERANCE = 1e-2


# --------------------------------------------------------------------------------------- baselines
def rms_norm_eager(x, weight, eps=1e-6):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)  # PyTorch's fused RMSNorm, fp32 accumulation


def gelu_eager(x, approximate="none"):
    return F.gelu(x, approximate=approximate)


def swiglu_eager(gate, up):
    return F.silu(gate) * up


def geglu_eager(gate, up):
    return F.gelu(gate, approximate="tanh") * up


def rope_eager(q, k, cos_full, sin_full):
    """The Hugging Face formulation on (B, T, H, D): ``x*cos + rotate_half(x)*sin``, cos/sin of (T, D)."""
    cos, sin = cos_full[None, :, None, :], sin_full[None, :, None, :]

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def cross_entropy_eager(logits, target, ignore_index=-100):
    # The usual training recipe upcasts the logits for a stable log-softmax.
    return F.cross_entropy(logits.float(), target, ignore_index=ignore_index)


def cross_entropy_options_eager(logits, target, ignore_index=-100, *, options: dict):
    """The options in PyTorch, as a model writes them: softcap, then F.cross_entropy with label
    smoothing, plus the z-loss averaged over the counted tokens."""
    z = logits.float()
    if options.get("softcap"):
        z = options["softcap"] * torch.tanh(z / options["softcap"])
    loss = F.cross_entropy(
        z, target, ignore_index=ignore_index, label_smoothing=options.get("label_smoothing", 0.0)
    )
    if options.get("lse_square_scale"):
        counted = target != ignore_index
        lse = torch.logsumexp(z, dim=-1)
        loss = loss + options["lse_square_scale"] * (lse.square() * counted).sum() / counted.sum()
    return loss


def cross_entropy_options_ours(logits, target, check_targets=True, *, options: dict):
    return cross_entropy(logits, target, **options, check_targets=check_targets)


def linear_cross_entropy_eager(x, weight, target, ignore_index=-100):
    """The usual LM head: bf16 linear, logits upcast to fp32 for the loss."""
    return F.cross_entropy(F.linear(x, weight).float(), target, ignore_index=ignore_index)


def fp8_eager(x, granularity="row", block=128):
    rows = x.reshape(*x.shape[:-1], -1, block) if granularity == "block" else x.unsqueeze(-2)
    amax = rows.abs().amax(dim=-1, keepdim=True).float()
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (rows.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.reshape(x.shape), scale.squeeze(-1)


def _first(out):
    """Liger's functions return the loss alone or (loss, extras...) depending on the version."""
    return out[0] if isinstance(out, tuple | list) else out


def _liger_ce_options(logits, target, options):
    return _first(
        LigerCrossEntropyFunction.apply(
            logits, target, None, -100, options.get("lse_square_scale", 0.0),
            options.get("label_smoothing", 0.0), "mean", options.get("softcap"),
        )
    )  # fmt: skip


def liger_ops() -> dict:
    """{kernel: Liger-Kernel's callable, or the reason its cell is skipped}."""
    if LIGER_MISSING:
        return dict.fromkeys(KERNELS, LIGER_MISSING)

    def liger_rope(q, k, cos_full, sin_full):
        # Liger takes (B, H, T, D) views of (B, T, H, D) storage: exactly our layout, transposed.
        q_out, k_out = LigerRopeFunction.apply(q.transpose(1, 2), k.transpose(1, 2), cos_full, sin_full)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)

    return {
        "rms_norm": lambda x, w: LigerRMSNormFunction.apply(x, w, 1e-6),
        "gelu": "Liger-Kernel 0.8.5 has no standalone GELU (only GEGLU)",
        "swiglu": LigerSiLUMulFunction.apply,
        "geglu": LigerGELUMulFunction.apply,
        "rope": liger_rope,
        "cross_entropy": lambda logits, target: LigerCrossEntropyFunction.apply(logits, target, None, -100)[
            0
        ],
        **{
            kernel: functools.partial(_liger_ce_options, options=options)
            for kernel, options in CE_OPTION_SETS.items()
        },
        "fused_linear_cross_entropy": lambda x, w, target: _first(
            LigerFusedLinearCrossEntropyFunction.apply(x, w, target)
        ),
        "fp8_row": "Liger-Kernel 0.8.5 has no FP8 quantisation",
        "fp8_block": "Liger-Kernel 0.8.5 has no FP8 quantisation",
    }


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


# -------------------------------------------------------------------------------------------- cases
@dataclass
class Case:
    """One kernel at one size: inputs, what is differentiated, bytes moved per pass, the functions."""

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
    return torch.randn(*shape, device=DEVICE, dtype=dtype).requires_grad_(requires_grad)


def _pass_bytes(fwd: int, bwd: int) -> dict[str, int]:
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}


def kernel_passes(kernel: str) -> tuple[str, ...]:
    """Cross-entropy's gradient is computed in our forward, so only forward+backward compares like
    with like; quantisation has no backward."""
    if kernel in ("cross_entropy", "fused_linear_cross_entropy", *CE_OPTION_SETS):
        return ("fwd+bwd",)
    if kernel.startswith("fp8"):
        return ("fwd",)
    return PASSES


def make_case(kernel: str, tokens: int, width: int, dtype: torch.dtype, liger: dict) -> Case:
    if kernel not in KERNELS:
        raise ValueError(f"kernel: unknown {kernel!r}; expected one of {', '.join(KERNELS)}")
    b = torch.finfo(dtype).bits // 8
    elems = tokens * width
    ours = {
        "rms_norm": rms_norm,
        "gelu": gelu,
        "swiglu": swiglu,
        "geglu": geglu,
        "rope": rope,
        "cross_entropy": cross_entropy,
        **{k: functools.partial(cross_entropy_options_ours, options=o) for k, o in CE_OPTION_SETS.items()},
        "fused_linear_cross_entropy": fused_linear_cross_entropy,
        "fp8_row": functools.partial(quantize_fp8, granularity="row"),
        "fp8_block": functools.partial(quantize_fp8, granularity="block", block=128),
    }
    compiled, liger_fn = None, liger[kernel]
    if kernel in ("rms_norm", "gelu", "swiglu", "geglu"):
        # Row-wise or elementwise: outputs and upstream gradients of the input's shape.
        if kernel == "rms_norm":
            args = [
                _randn(tokens, width, dtype=dtype, requires_grad=True),
                (1 + 0.1 * _randn(width, dtype=torch.float32)).to(dtype).requires_grad_(),
            ]
            fwd = 2 * elems * b + width * b + tokens * 4
            bwd = 3 * elems * b + 2 * width * b + tokens * 4
            eager = rms_norm_eager
        else:
            n_in = 1 if kernel == "gelu" else 2
            args = [_randn(tokens, width, dtype=dtype, requires_grad=True) for _ in range(n_in)]
            fwd, bwd = (n_in + 1) * elems * b, (2 * n_in + 1) * elems * b
            eager = {"gelu": gelu_eager, "swiglu": swiglu_eager, "geglu": geglu_eager}[kernel]
        grad_outs, nbytes = [_randn(tokens, width, dtype=dtype)], _pass_bytes(fwd, bwd)
    elif kernel == "rope":
        d = ROPE_HEAD_DIM
        heads = width // d
        kv_heads = max(1, heads // 4)
        seq = min(tokens, 4096)
        batch = tokens // seq
        q = _randn(batch, seq, heads, d, dtype=dtype, requires_grad=True)
        k = _randn(batch, seq, kv_heads, d, dtype=dtype, requires_grad=True)
        cos, sin = rope_cache(seq, d, device=DEVICE)
        moved = 2 * (q.numel() + k.numel()) * b + 2 * cos.numel() * 4
        args, nbytes = [q, k, cos, sin], _pass_bytes(moved, moved)
        grad_outs = [_randn(*q.shape, dtype=dtype), _randn(*k.shape, dtype=dtype)]
        # eager and Liger take the Hugging Face layout: cos/sin of (T, D), duplicated halves, in x's dtype
        cos_full, sin_full = torch.cat([cos, cos], -1).to(dtype), torch.cat([sin, sin], -1).to(dtype)
        eager = lambda q, k, c, s: rope_eager(q, k, cos_full, sin_full)
        compiled = _compiled(rope_eager, cos_full, sin_full)
        if not isinstance(liger_fn, str):
            liger_rope = liger_fn
            liger_fn = lambda q, k, c, s: liger_rope(q, k, cos_full, sin_full)
    elif kernel == "cross_entropy" or kernel in CE_OPTION_SETS:
        logits = _randn(tokens, width, dtype=dtype, requires_grad=True)
        target = torch.randint(0, width, (tokens,), device=DEVICE)
        target[::97] = -100  # a few ignored positions (padding)
        args, grad_outs, nbytes = [logits, target], None, {"fwd+bwd": 2 * elems * b + tokens * 8}
        eager = (
            cross_entropy_eager
            if kernel == "cross_entropy"
            else functools.partial(cross_entropy_options_eager, options=CE_OPTION_SETS[kernel])
        )
    elif kernel == "fused_linear_cross_entropy":
        # width is the vocabulary; GB/s counts x, W read and dx, dW written once (the floor is the GEMMs).
        hidden = FLCE_HIDDEN
        x = (_randn(tokens, hidden, dtype=torch.float32)).to(dtype).requires_grad_()
        weight = (_randn(width, hidden, dtype=torch.float32) / hidden**0.5).to(dtype).requires_grad_()
        target = torch.randint(0, width, (tokens,), device=DEVICE)
        target[::97] = -100
        moved = 2 * (tokens + width) * hidden * b + tokens * 8
        args, grad_outs, nbytes = [x, weight, target], None, {"fwd+bwd": moved}
        eager = linear_cross_entropy_eager
    else:  # fp8_row, fp8_block
        granularity = kernel.removeprefix("fp8_")
        x = _randn(tokens, width, dtype=dtype)
        n_scales = tokens * (1 if granularity == "row" else width // 128)
        args, grad_outs, nbytes = [x], None, {"fwd": elems * b + elems + n_scales * 4}
        eager = functools.partial(fp8_eager, granularity=granularity, block=128)
    functions = {
        "ours": ours[kernel],
        "eager": eager,
        "compile": compiled or _compiled(eager),
        "liger": liger_fn,
    }
    if kernel in TARGET_CHECKED:
        functions["ours-unchecked"] = functools.partial(functions["ours"], check_targets=False)
    return Case(kernel, tokens, width, args, grad_outs, nbytes, functions, kernel_passes(kernel))


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
    """The eager function on fp32 copies of the inputs (fp8 quantisation: the input itself, to which
    the dequantised outputs are compared)."""
    if case.kernel.startswith("fp8"):
        return [case.args[0].float()], []
    args = [
        a.detach().float().requires_grad_(a.requires_grad) if a.is_floating_point() else a for a in case.args
    ]
    outs = _outputs(case.functions["eager"](*args))
    diff = case.diff_args(args)
    grads = torch.autograd.grad(outs, diff, [g.float() for g in case.grad_outs] if case.grad_outs else None)
    return [o.detach() for o in outs], list(grads)


def relative_error(case: Case, got, ref) -> float:
    """The largest relative error of any output or gradient (NaN if any is NaN)."""
    outs, grads = got
    if case.kernel.startswith("fp8"):
        q, scales = outs
        group = 128 if case.kernel == "fp8_block" else case.width
        outs = [q.float() * scales.float().repeat_interleave(group, dim=-1)]
    errs = [rel_err(a, b) for a, b in zip([*outs, *grads], [*ref[0], *ref[1]], strict=False)]
    return max(errs) if all(e == e for e in errs) else float("nan")


def _fresh(args: list) -> list:
    """Copies, so an implementation that writes into its inputs (Liger does) spoils nobody else's."""
    return [
        a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args
    ]


def _timer(case: Case, fn: Callable, args: list, pass_: str) -> Callable:
    diff = case.diff_args(args)
    if pass_ == "fwd":
        return lambda: fn(*args)
    if pass_ == "bwd":
        kept = [o for o in _outputs(fn(*args)) if o.requires_grad]
        return lambda: torch.autograd.grad(kept, diff, case.grad_outs, retain_graph=True)

    def fwd_bwd():
        outs = _outputs(fn(*args))
        return torch.autograd.grad([o for o in outs if o.requires_grad], diff, case.grad_outs)

    return fwd_bwd


@functools.cache
def copy_gbps(nbytes: int, warmup_ms: float, rep_ms: float) -> float:
    """GB/s of a device copy (``clone()``) that reads and writes ``nbytes`` in all, once per size."""
    src = torch.randn(max(nbytes // 4, 1), device=DEVICE, dtype=torch.bfloat16)
    return nbytes / bench(src.clone, warmup_ms=warmup_ms, rep_ms=rep_ms).ms / 1e6


class _CaseCells:
    """The cells of one kernel at one size. The inputs and the fp32 reference are built when its first
    cell runs (a failure there fails each of its cells, as rows); each variant is checked once, before
    its first pass is timed, and its inputs are dropped when the next variant starts -- except for an
    INTERLEAVED kernel, whose variants' inputs stay until all are timed together, in rounds, by the
    first cell of each pass."""

    def __init__(self, kernel, tokens, width, dtype, liger, variants):
        self.spec = (kernel, tokens, width, dtype, liger)
        self.variants = variants
        self.case = self.ref = None
        self.checked: dict[str, tuple] = {}
        self.rounds: dict[str, dict] = {}

    def _case(self) -> Case:
        if self.case is None:
            self.case = make_case(*self.spec)
            self.ref = reference(self.case)
        return self.case

    def _check(self, variant: str):
        """(args, relative error, extra GB) of ``variant``, or the exception its check raised."""
        if variant not in self.checked:
            if self.spec[0] not in INTERLEAVED:
                self.checked.clear()  # the previous variant's inputs and outputs: no longer needed
            try:
                case = self._case()
                fn = case.functions[variant]
                args = _fresh(case.args)
                err = relative_error(case, run_once(case, fn, args), self.ref)
                check_close(f"{case.kernel} {variant}", err, TOLERANCE.get(case.kernel, DEFAULT_TOLERANCE))
                with measure_peak_memory() as mem:
                    run_once(case, fn, args)
                self.checked[variant] = (args, err, (mem.peak_bytes - mem.start_bytes) / 1e9)
            except Exception as exc:
                self.checked[variant] = exc
        result = self.checked[variant]
        if isinstance(result, Exception):
            raise result
        return result

    def _interleaved(self, pass_: str, bench_kw: dict):
        """Every variant that passes its check, timed in alternating rounds; once per pass."""
        if pass_ not in self.rounds:
            timers = {}
            for variant in self.variants:
                try:
                    args = self._check(variant)[0]
                except Exception:
                    continue  # its own cell reports the failure
                timers[variant] = _timer(self.case, self.case.functions[variant], args, pass_)
            self.rounds[pass_] = bench_interleaved(timers, rounds=INTERLEAVED[self.spec[0]], **bench_kw)
        return self.rounds[pass_]

    def run(self, variant: str, pass_: str, bench_kw: dict) -> dict:
        args, err, extra_gb = self._check(variant)
        case = self.case
        timer = _timer(case, case.functions[variant], args, pass_)
        nbytes = case.bytes[pass_]
        if case.kernel in INTERLEAVED:
            row = {
                **timing_row(self._interleaved(pass_, bench_kw)[variant], nbytes=nbytes),
                "rounds": INTERLEAVED[case.kernel],
            }
        else:
            row = timed(timer, nbytes=nbytes, **bench_kw)
        host_ms, device_ms = host_and_device_ms(timer)
        copy = copy_gbps(nbytes, bench_kw.get("warmup_ms", 100.0), bench_kw.get("rep_ms", 500.0))
        inputs_gb = sum(a.numel() * a.element_size() for a in case.args if isinstance(a, torch.Tensor)) / 1e9
        return {
            **row,
            "bytes": nbytes,
            "copy_gbps": copy,
            "pct_copy": 100 * row["gbps"] / copy,
            "rel_err": err,
            "extra_mem_gb": extra_gb,
            "inputs_gb": inputs_gb,
            "host_ms": host_ms,
            "device_ms": device_ms,
        }


def _skipped(reason: str) -> Callable[[], dict]:
    return lambda: {"status": "skipped", "error": reason}


def count_cells(kernels, variants, passes, sizes) -> int:
    liger = liger_ops()
    n = 0
    for kernel in kernels:
        per_variant = len([p for p in kernel_passes(kernel) if p in passes])
        for _ in sizes_of(kernel, sizes):
            n += sum(
                1 if v == "liger" and isinstance(liger[kernel], str) else per_variant
                for v in variants
                if v != "ours-unchecked" or kernel in TARGET_CHECKED
            )
    return n


def sizes_of(kernel: str, sizes) -> list[tuple[int, int]]:
    """The (tokens, width) of ``kernel`` in the size sets ``sizes``, without repeats, in order."""
    return list(dict.fromkeys(s for name in sizes for s in SIZES[name][kernel]))


def cells(kernels, variants, passes, sizes, dtype_name: str, bench_kw: dict) -> Iterator[Cell]:
    """One cell per kernel, size, variant and pass (one per variant when Liger's op is missing)."""
    liger = liger_ops() if "liger" in variants else dict.fromkeys(KERNELS, "not requested")
    dtype = DTYPES[dtype_name]
    for kernel in kernels:
        # nothing to uncheck where targets are not checked
        runs = [v for v in variants if v != "ours-unchecked" or kernel in TARGET_CHECKED]
        for tokens, width in sizes_of(kernel, sizes):
            timed_variants = [v for v in runs if v != "liger" or not isinstance(liger[kernel], str)]
            group = _CaseCells(kernel, tokens, width, dtype, liger, timed_variants)
            key = {"kernel": kernel, "tokens": tokens, "width": width}
            for variant in runs:
                if variant not in timed_variants:
                    yield Cell(
                        variant,
                        f"{tokens}x{width}",
                        dtype_name,
                        _skipped(liger[kernel]),
                        {**key, "pass": "all"},
                    )
                    continue
                for pass_ in kernel_passes(kernel):
                    if pass_ in passes:
                        run = functools.partial(group.run, variant, pass_, bench_kw)
                        yield Cell(variant, f"{tokens}x{width}", dtype_name, run, {**key, "pass": pass_})
            del group  # this size's tensors go before the next size's are made


# --------------------------------------------------------------------------------------- tuning
# (block bytes, warps, programs per SM) and (warps per SM, stages): what the committed settings were
# chosen from.
# At 32 warps a thread has 64 registers: 64 KB blocks spill (82 bytes a thread for the plain loss, 272
# with every option, sm_90 ptxas); 32 KB at 32 warps and 16 KB at 16 warps spill nothing.
CE_SETTINGS = [
    (65536, 32, 1.0), (131072, 32, 1.0), (65536, 16, 2.0), (32768, 16, 2.0), (32768, 32, 1.0),
    (16384, 16, 2.0), (16384, 16, 4.0), (32768, 32, 2.0),
]  # fmt: skip
# The kernels with a softcap also run each setting with the running max instead of the fixed one.
CE_SOFTCAP_KERNELS = ("cross_entropy_options", "cross_entropy_softcap")
RMS_SETTINGS = [(16, 1), (32, 1), (16, 2), (32, 2), (16, 3), (32, 3)]
# Rows short enough for SHORT_ROW_SETTINGS (cross_entropy.settings_for): those settings against the
# long rows' and the softcap's short-row ones, and each of their two departures from the rest undone.
CE_SHORT_SETTINGS = [
    SHORT_ROW_SETTINGS,
    DEFAULT_SETTINGS,
    SOFTCAP_SHORT_ROW_SETTINGS,
    dataclasses.replace(SHORT_ROW_SETTINGS, smoothing_sum_sweep2=True),
    dataclasses.replace(SHORT_ROW_SETTINGS, max_registers=None),
]
TUNE_SIZES = {
    "cross_entropy": (16384, 128256),
    "cross_entropy_short": (4096, 32000),
    "rms_norm": (65536, 8192),
}
TUNE_SIZES_CPU = {"cross_entropy": (5, 700), "cross_entropy_short": (5, 300), "rms_norm": (33, 200)}


def tune_cells(dtype_name: str, bench_kw: dict, kernels=KERNELS) -> list[Cell]:
    """Cross-entropy forward+backward and RMSNorm backward at their tuning sizes, once per setting,
    each checked against the fp32 eager result before it is timed; only the sweeps of ``kernels``."""
    dtype = DTYPES[dtype_name]
    sizes = TUNE_SIZES if ON_GPU else TUNE_SIZES_CPU
    out = []
    rows, vocab = sizes["cross_entropy"]
    # The plain loss, every option on, and each option alone.
    for kernel in (
        "cross_entropy",
        "cross_entropy_options",
        "cross_entropy_smoothing",
        "cross_entropy_softcap",
        "cross_entropy_zloss",
    ):
        if kernel not in kernels:
            continue
        for block_bytes, warps, per_sm in CE_SETTINGS:
            for fixed in (True, False) if kernel in CE_SOFTCAP_KERNELS else (True,):
                block = block_bytes if ON_GPU else block_bytes // 64
                setting = CrossEntropySettings(block, warps, per_sm, fixed_max=fixed)
                run = functools.partial(_tune_cross_entropy, kernel, rows, vocab, dtype, setting, bench_kw)
                name = _ce_setting_name(setting, *(("fixed_max",) if kernel in CE_SOFTCAP_KERNELS else ()))
                out.append(_tune_cell(kernel, rows, vocab, "fwd+bwd", dtype_name, name, run))
        short_rows, short_vocab = sizes["cross_entropy_short"]
        for setting in CE_SHORT_SETTINGS:
            run = functools.partial(
                _tune_cross_entropy, kernel, short_rows, short_vocab, dtype, setting, bench_kw
            )
            name = _ce_setting_name(setting, "max_registers", "smoothing_sum_sweep2")
            out.append(_tune_cell(kernel, short_rows, short_vocab, "fwd+bwd", dtype_name, name, run))
    rows, width = sizes["rms_norm"]
    for warps_per_sm, stages in RMS_SETTINGS if "rms_norm" in kernels else ():
        setting = RMSNormSettings(bwd_warps_per_sm=warps_per_sm, bwd_stages=stages)
        run = functools.partial(_tune_rms_norm, rows, width, dtype, setting, bench_kw)
        name = f"warps_per_sm={warps_per_sm},stages={stages}"
        out.append(_tune_cell("rms_norm", rows, width, "bwd", dtype_name, name, run))
    return out


def _ce_setting_name(setting: CrossEntropySettings, *fields: str) -> str:
    """A tune row's name for ``setting``: its block, warps and programs per SM, then ``fields``."""
    name = f"block_bytes={setting.block_bytes},warps={setting.num_warps},programs_per_sm={setting.programs_per_sm}"
    return name + "".join(f",{field}={getattr(setting, field)}" for field in fields)


def _tune_cell(kernel, tokens, width, pass_, dtype_name, setting, run) -> Cell:
    columns = {"kernel": kernel, "tokens": tokens, "width": width, "pass": pass_, "setting": setting}
    return Cell("ours", f"{tokens}x{width}", dtype_name, run, columns)


def _tune_cross_entropy(kernel, rows, vocab, dtype, setting, bench_kw) -> dict:
    """``cross_entropy`` (the plain loss) or a ``CE_OPTION_SETS`` cell (the options kernel)."""
    options = CE_OPTION_SETS.get(kernel)
    logits = _randn(rows, vocab, dtype=dtype, requires_grad=True)
    target = torch.randint(0, vocab, (rows,), device=DEVICE)
    if options is None:
        ref = torch.autograd.grad(F.cross_entropy(logits.float(), target), logits)[0]
    else:
        ref = torch.autograd.grad(
            cross_entropy_options_eager(logits.float(), target, options=options), logits
        )[0]
    kernel_options = CrossEntropyOptions(**options) if options is not None else None

    def step():
        loss = CrossEntropyFunction.apply(logits, target, -100, "mean", False, True, setting, kernel_options)
        return torch.autograd.grad(loss, logits)[0]

    err = rel_err(step(), ref)
    check_close(kernel, err, DEFAULT_TOLERANCE)
    return {**timed(step, nbytes=2 * logits.numel() * logits.element_size(), **bench_kw), "rel_err": err}


def _tune_rms_norm(rows, width, dtype, setting, bench_kw) -> dict:
    x = _randn(rows, width, dtype=dtype, requires_grad=True)
    w = (1 + 0.1 * _randn(width, dtype=torch.float32)).to(dtype).requires_grad_()
    dy = torch.randn_like(x)
    ref = torch.autograd.grad(F.rms_norm(x.float(), (width,), w.float(), 1e-6), x, dy.float())[0]
    y = RMSNormFunction.apply(x, w, 1e-6, setting)

    def backward():
        return torch.autograd.grad(y, (x, w), dy, retain_graph=True)

    err = rel_err(backward()[0], ref)
    check_close("rms_norm", err, DEFAULT_TOLERANCE)
    return {**timed(backward, nbytes=3 * x.numel() * x.element_size(), **bench_kw), "rel_err": err}
