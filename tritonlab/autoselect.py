"""Choose between Triton and PyTorch per operation at run time, by timing both at the model's own shapes.

    from tritonlab.autoselect import select, apply

    selection = select(model, (tokens, targets), mode="train")   # inside the training autocast, if any
    apply(model, selection)                                        # the model's code is not edited
    print(selection.table())                                       # also logged through `logging`

Design
------
*Operations.* Five, each a PyTorch implementation and a Triton one with the same signature
(:data:`OPS`): ``rms_norm`` (``x, weight, eps``; PyTorch: ``F.rms_norm``), ``swiglu`` (``gate, up``),
``rope`` (``q, k, cos, sin`` on (B, T, H, D), half rotation), ``cross_entropy`` (``logits (N, V),
targets (N,)``) and ``attention`` (causal, ``q, k, v`` on (B, H, T, D); PyTorch: SDPA, Triton:
flash2's FlashAttention-2). The PyTorch side of attention is always SDPA, so a model built with the
naive attention runs SDPA where PyTorch is chosen.

*Where they are swapped in.* :func:`apply` changes an existing module in place: every
``torch.nn.RMSNorm`` gets a subclass (its class is swapped; parameters, state dict, hooks and
``isinstance`` stay as they were) whose forward dispatches; a module with an ``LMComponents``
``components`` attribute (``tritonlab.models.TransformerLM``, whose blocks share one) gets a
dispatcher in each component slot (a fused residual add + norm, ``add_norm``, is set aside while
``rms_norm`` dispatches, so every norm goes through the dispatcher). :func:`unapply` restores both.

*What is timed.* :func:`select` runs the model's forward once (under ``no_grad``, with
``model.loss(*batch)`` when the batch is a pair and the model has ``loss``) with recording
wrappers, so it learns every (op, argument shapes, dtypes) the model really calls, and the autocast
state of each call. For each distinct key it builds random inputs of those shapes and dtypes on the
same device, runs both implementations once (the trial call; compile and autotuning happen here)
and compares outputs and, in "train" mode, input gradients (relative error, :data:`TOLERANCE`), then
times both with ``timer``: in "train" mode forward and backward (a fixed random upstream gradient),
in "inference" mode forward under ``no_grad``. The default timer is ``triton.testing.do_bench``
(median and (q80 - q20) / 2 as the spread) on a GPU, three host-clock calls on the CPU. An injected
timer is ``timer(fn, trial) -> ms`` or ``(ms, spread)``; ``trial`` says op, impl ("pytorch" or
"triton"), shapes, dtype.

*The choice.* Triton when it is faster by more than the spread and by more than ``tie_margin``
(2 %); on a tie PyTorch stays (nothing to gain, fewer moving parts). PyTorch, with the reason
recorded, when Triton cannot run: ``triton`` (or the kernels) is not importable; no CUDA device --
tensors on the CPU count as runnable only when Triton's interpreter is on (``TRITON_INTERPRET=1``
set before ``tritonlab`` was imported; then the interpreter's times decide, which measure nothing
but exercise every path); an unsupported shape, dtype or head dimension (flash2 takes D in 16, 32,
64, 128: head dim 48 falls back rather than being padded); a compile or launch error on the trial
call; a result that disagrees with PyTorch beyond tolerance. ``benchmark_kernels=False`` skips the
timing: Triton wherever it runs and agrees. ``force={"rms_norm": True}`` insists on Triton and
raises :class:`AutoselectError` naming the op (and why) where it cannot run -- never a silent
fallback; ``False`` insists on PyTorch; ``None`` (the default) times. Any other failure inside the
selector falls back to PyTorch with the error as the reason: training never breaks because of it.

*Cache.* A JSON file (``cache=`` a path, an :class:`AutoselectCache`, or False for none; by default
``$TRITONLAB_AUTOSELECT_CACHE`` or ``~/.cache/tritonlab/autoselect.json``, never inside the
checkout) maps "device | torch | triton | mode | op | shapes | dtype" to the choice and its times;
forced choices are not stored. A file that is not valid JSON of the expected form is ignored with a
warning and rewritten whole on the next save (written atomically).

*New shapes.* A dispatcher that meets a key the selection has not seen (a new sequence length)
selects for that key alone, once, on random inputs of its shapes (the cache first), logs the row,
and goes on; a Triton call that raises in the forward is replaced by PyTorch's for that key.

*Logging.* :meth:`Selection.table` is the console table (op, shapes, PyTorch ms, Triton ms, speedup,
using), logged at INFO on the ``tritonlab.autoselect`` logger; :meth:`Selection.rows` gives one dict
per (op, shapes, dtype) for CSV rows; if ``wandb`` is importable and a run is active, the choices
go into the run summary (never a dependency).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import statistics
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# The model's own PyTorch components, and its Triton ones where they take the same arguments.
from .models.lm import (
    _cross_entropy_triton,
    _rope_triton,
    _swiglu_triton,
    cross_entropy_eager,
    rope_eager,
    sdpa_causal_attention,
    swiglu_eager,
)

logger = logging.getLogger("tritonlab.autoselect")

OP_NAMES = ("rms_norm", "swiglu", "rope", "cross_entropy", "attention")
MODES = ("train", "inference")
# Relative error (whole tensor) allowed between the two implementations on the trial inputs.
TOLERANCE = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 3e-2}
FLASH_HEAD_DIMS = (16, 32, 64, 128)
COMPONENT_SLOTS = {"norm": "rms_norm", "swiglu": "swiglu", "rope": "rope", "loss": "cross_entropy",
                   "attention": "attention"}  # fmt: skip


class AutoselectError(RuntimeError):
    """A forced Triton choice that cannot run, or a bad argument to the selector."""


# --- the operations --------------------------------------------------------------------------------


def _torch_rms_norm(x: Tensor, weight: Tensor | None, eps: float | None) -> Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _triton_rms_norm(x: Tensor, weight: Tensor | None, eps: float | None) -> Tensor:
    from tritonlab.ops import rms_norm

    return rms_norm(x, weight, torch.finfo(x.dtype).eps if eps is None else eps)


def _triton_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    from tritonlab.attention import FlashAttentionTriton

    B, H, T, D = q.shape
    o = FlashAttentionTriton.apply(
        q.reshape(B * H, T, D), k.reshape(B * H, T, D), v.reshape(B * H, T, D), True
    )
    return o.view(B, H, T, D)


def _unsupported_rms_norm(args) -> str | None:
    x = args[0]
    return None if x.shape[-1] <= 65536 else f"hidden size {x.shape[-1]} > 65536"


def _unsupported_rope(args) -> str | None:
    q = args[0]
    return None if q.dim() == 4 and q.shape[-1] % 2 == 0 else f"q shape {tuple(q.shape)}"


def _unsupported_attention(args) -> str | None:
    q, k, v = args
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        return f"q, k, v shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)} (self-attention only)"
    if q.shape[-1] not in FLASH_HEAD_DIMS:
        return f"head dim {q.shape[-1]} (flash2 takes {', '.join(map(str, FLASH_HEAD_DIMS))})"
    return None


@dataclass(frozen=True)
class Op:
    """One operation: its two implementations, shape limits, and which arguments get gradients."""

    name: str
    pytorch: Callable
    triton: Callable
    unsupported: Callable = field(default=lambda args: None)
    grad_args: tuple[int, ...] = ()  # positions of the arguments a backward differentiates


OPS: dict[str, Op] = {
    "rms_norm": Op("rms_norm", _torch_rms_norm, _triton_rms_norm, _unsupported_rms_norm, (0, 1)),
    "swiglu": Op("swiglu", swiglu_eager, _swiglu_triton, grad_args=(0, 1)),
    "rope": Op("rope", rope_eager, _rope_triton, _unsupported_rope, (0, 1)),
    "cross_entropy": Op("cross_entropy", cross_entropy_eager, _cross_entropy_triton, grad_args=(0,)),
    "attention": Op("attention", sdpa_causal_attention, _triton_attention, _unsupported_attention, (0, 1, 2)),
}


# --- keys: what a call looks like -------------------------------------------------------------------


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class ArgSpec:
    """A tensor argument's shape and dtype (or a plain value, kept as is)."""

    shape: tuple[int, ...] | None
    dtype: str | None
    value: object = None


@dataclass(frozen=True)
class CallSpec:
    """One distinct call of an op: its arguments, device and autocast state; ``key()`` names it."""

    op: str
    args: tuple[ArgSpec, ...]
    device: str
    autocast: str | None  # the autocast dtype in force, or None

    @classmethod
    def of(cls, op: str, args: tuple) -> CallSpec:
        specs, device = [], "cpu"
        for a in args:
            if isinstance(a, Tensor):
                specs.append(ArgSpec(tuple(a.shape), _dtype_name(a.dtype)))
                device = a.device.type if device == "cpu" else device
            else:
                specs.append(ArgSpec(None, None, a))
        auto = None
        if torch.is_autocast_enabled(device):
            auto = _dtype_name(torch.get_autocast_dtype(device))
        return cls(op, tuple(specs), device, auto)

    @property
    def shapes(self) -> str:
        return ", ".join("x".join(map(str, a.shape)) or "scalar" for a in self.args if a.shape is not None)

    @property
    def dtype(self) -> str:
        names = list(
            dict.fromkeys(a.dtype for a in self.args if a.dtype and a.dtype not in ("int64", "int32"))
        )
        text = "/".join(names)
        return f"{text} (autocast {self.autocast})" if self.autocast else text

    def key(self) -> tuple[str, str, str]:
        return (self.op, self.shapes, self.dtype)


def _make_inputs(spec: CallSpec, grads: bool, seed: int = 0) -> list:
    """Random arguments of ``spec``'s shapes and dtypes on its device (targets in the vocabulary,
    RMSNorm weights near 1, RoPE tables cos/sin of random angles)."""
    gen = torch.Generator().manual_seed(seed)
    device = torch.device(spec.device)
    op = OPS[spec.op]
    out = []
    for i, a in enumerate(spec.args):
        if a.shape is None:
            out.append(a.value)
            continue
        dtype = getattr(torch, a.dtype)
        if not dtype.is_floating_point:  # cross-entropy targets
            vocab = spec.args[0].shape[-1]
            out.append(torch.randint(0, vocab, a.shape, generator=gen).to(device=device, dtype=dtype))
            continue
        t = torch.randn(a.shape, generator=gen)
        if spec.op == "rms_norm" and i == 1:
            t = 1 + 0.1 * t
        if spec.op == "rope" and i in (2, 3):
            angles = torch.rand(a.shape, generator=gen) * 6.283
            t = angles.cos() if i == 2 else angles.sin()
        t = t.to(device=device, dtype=dtype)
        if grads and i in op.grad_args:
            t.requires_grad_(True)
        out.append(t)
    return out


def _autocast(spec: CallSpec):
    if spec.autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(spec.device, dtype=getattr(torch, spec.autocast))


def _outputs(result) -> list[Tensor]:
    return list(result) if isinstance(result, tuple | list) else [result]


def _make_step(fn: Callable, spec: CallSpec, inputs: list, train: bool) -> Callable[[], list[Tensor]]:
    """One call of ``fn`` on ``inputs``: forward (and backward with fixed upstream gradients in
    train mode) under the call's autocast; returns the outputs then the input gradients."""
    upstream: list[Tensor] | None = None

    def step() -> list[Tensor]:
        nonlocal upstream
        if not train:
            with torch.no_grad(), _autocast(spec):
                return _outputs(fn(*inputs))
        for t in inputs:
            if isinstance(t, Tensor) and t.requires_grad:
                t.grad = None
        with torch.enable_grad(), _autocast(spec):
            outs = _outputs(fn(*inputs))
        if upstream is None:
            gen = torch.Generator().manual_seed(1)
            upstream = [torch.randn(o.shape, generator=gen).to(o.device, o.dtype) for o in outs]
        torch.autograd.backward(outs, upstream)
        grads = [t.grad for t in inputs if isinstance(t, Tensor) and t.requires_grad]
        return [o.detach() for o in outs] + grads

    return step


def _rel_err(got: Tensor | None, ref: Tensor | None) -> float:
    if got is None or ref is None:  # a gradient one side gives and the other does not
        return 0.0 if got is None and ref is None else math.inf
    if got.shape != ref.shape:
        return math.inf
    got, ref = got.detach().double(), ref.detach().double()
    return ((got - ref).norm() / max(ref.norm().item(), 1e-30)).item()


# --- timers ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    """What a timer is asked to time."""

    op: str
    impl: str  # "pytorch" or "triton"
    shapes: str
    dtype: str
    mode: str


def default_timer(fn: Callable[[], object], trial: Trial) -> tuple[float, float]:
    """``triton.testing.do_bench`` on a GPU (median, and (q80 - q20) / 2 as the spread); on the CPU
    the median of three host-clock calls after one warm-up (a smoke check, not a measurement)."""
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        from triton.testing import do_bench

        lo, mid, hi = do_bench(fn, warmup=10, rep=40, quantiles=[0.2, 0.5, 0.8])
        return float(mid), float(hi - lo) / 2
    fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    q = sorted(times)
    return statistics.median(times), (q[-2] - q[1]) / 2


def _call_timer(timer, fn, trial) -> tuple[float, float]:
    got = timer(fn, trial)
    if isinstance(got, tuple | list):
        return float(got[0]), float(got[1])
    return float(got), 0.0


# --- the result ------------------------------------------------------------------------------------


@dataclass
class Choice:
    """The decision for one (op, shapes, dtype)."""

    op: str
    shapes: str
    dtype: str
    mode: str
    choice: str  # "triton" or "pytorch"
    reason: str
    pytorch_ms: float = math.nan
    triton_ms: float = math.nan
    pytorch_spread_ms: float = math.nan
    triton_spread_ms: float = math.nan
    max_rel_err: float = math.nan
    source: str = "timed"  # timed, cache, forced, fallback, lazy

    @property
    def speedup(self) -> float:
        """PyTorch ms / Triton ms (> 1: Triton is faster)."""
        if not (self.pytorch_ms > 0 and self.triton_ms > 0):
            return math.nan
        return self.pytorch_ms / self.triton_ms

    def row(self) -> dict:
        return {**asdict(self), "speedup": self.speedup}


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.4f}"


@dataclass
class Selection:
    """Choices per (op, shapes, dtype); a :class:`Selector` behind it selects new keys lazily."""

    choices: dict[tuple[str, str, str], Choice] = field(default_factory=dict)
    selector: Selector | None = None
    startup_s: float = 0.0
    specs: dict[tuple[str, str, str], CallSpec] = field(default_factory=dict)
    # Where startup_s went: the forward that records the calls, and choosing each key (trial calls,
    # Triton's first compile and launch, timing; ~0 for a cached key).
    forward_s: float = 0.0
    select_s: dict[tuple[str, str, str], float] = field(default_factory=dict)

    def lookup(self, spec: CallSpec) -> Choice:
        key = spec.key()
        found = self.choices.get(key)
        if found is None:
            if self.selector is None:
                return Choice(
                    spec.op, key[1], key[2], "", "pytorch", "no selector for a new key", source="fallback"
                )
            found = self.selector.choose(spec, source="lazy")
            self.choices[key], self.specs[key] = found, spec
            logger.info("autoselect: new shape\n%s", _table([found]))
        return found

    def uses_triton(self, op: str | None = None) -> bool:
        return any(c.choice == "triton" for c in self.choices.values() if op is None or c.op == op)

    def rows(self) -> list[dict]:
        return [{**c.row(), "select_s": self.select_s.get(k, math.nan)} for k, c in self.choices.items()]

    def table(self) -> str:
        return _table(list(self.choices.values()))

    def log(self, level: int = logging.INFO) -> None:
        logger.log(level, "autoselect (%s):\n%s", _describe_env(), self.table())
        _log_wandb(self)


def _table(choices: Iterable[Choice]) -> str:
    head = ("op", "shapes", "dtype", "PyTorch ms", "Triton ms", "speedup", "using")
    lines = [head]
    for c in choices:
        speed = "-" if math.isnan(c.speedup) else f"{c.speedup:.2f}x"
        using = c.choice if c.source in ("timed", "lazy") else f"{c.choice} ({c.reason})"
        lines.append((c.op, c.shapes, c.dtype, _ms(c.pytorch_ms), _ms(c.triton_ms), speed, using))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    right = {3, 4, 5}
    out = []
    for row in lines:
        out.append(
            "  ".join(
                s.rjust(w) if i in right else s.ljust(w)
                for i, (s, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    return "\n".join(line.rstrip() for line in out)


def _log_wandb(selection: Selection) -> None:
    """The choices into the active wandb run's summary, if wandb is importable and a run is active."""
    try:
        import wandb  # type: ignore[import-not-found]
    except Exception:
        return
    try:
        run = getattr(wandb, "run", None)
        if run is None:
            return
        for c in selection.choices.values():
            run.summary[f"autoselect/{c.op}/{c.shapes}/{c.dtype}"] = c.choice
    except Exception as err:  # logging never breaks training
        logger.warning("autoselect: could not log to wandb: %s", err)


# --- environment and cache -------------------------------------------------------------------------


def _triton_version() -> str | None:
    try:
        import triton

        return triton.__version__
    except Exception:
        return None


def _interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _describe_env() -> str:
    if torch.cuda.is_available() and not _interpreter_on():
        device = torch.cuda.get_device_name()
    else:
        device = "cpu (TRITON_INTERPRET=1)" if _interpreter_on() else "cpu"
    return f"{device} | torch {torch.__version__} | triton {_triton_version()}"


def triton_unavailable(device: str) -> str | None:
    """Why Triton cannot run for tensors on ``device`` here, or None when it can."""
    if _triton_version() is None:
        return "triton not importable"
    try:
        from tritonlab._runtime import INTERPRET
    except Exception as err:
        return f"tritonlab kernels not importable: {err}"
    if device == "cuda":
        if not torch.cuda.is_available():
            return "no CUDA device"
        if INTERPRET:
            return "Triton's interpreter is on (TRITON_INTERPRET=1) but the tensors are on cuda"
        return None
    if device == "cpu":
        if INTERPRET and _interpreter_on():
            return None
        return "no CUDA device (tensors on cpu; Triton's interpreter is off: TRITON_INTERPRET=1 runs it)"
    return f"no CUDA device (tensors on {device})"


def default_cache_path() -> Path:
    if os.environ.get("TRITONLAB_AUTOSELECT_CACHE"):
        return Path(os.environ["TRITONLAB_AUTOSELECT_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "tritonlab" / "autoselect.json"


class AutoselectCache:
    """Choices on disk, keyed by (device, torch and triton versions, mode, op, shapes, dtype)."""

    VERSION = 1

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else default_cache_path()
        self.entries: dict[str, dict] = {}
        self.loaded_corrupt = False
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text())
            if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
                raise ValueError("not a {'version', 'entries'} object")
            self.entries = {k: v for k, v in data["entries"].items() if isinstance(v, dict) and "choice" in v}
        except Exception as err:
            self.loaded_corrupt = True
            self.entries = {}
            message = f"autoselect: ignoring the corrupt cache {self.path} ({err}); it will be rewritten"
            logger.warning(message)
            warnings.warn(message, stacklevel=3)

    @staticmethod
    def key(mode: str, op: str, shapes: str, dtype: str) -> str:
        return " | ".join((_describe_env(), mode, op, shapes, dtype))

    def get(self, mode: str, spec: CallSpec) -> Choice | None:
        entry = self.entries.get(self.key(mode, *spec.key()))
        if entry is None:
            return None
        try:
            fields = {k: entry[k] for k in Choice.__dataclass_fields__ if k in entry}
            return Choice(**{**fields, "source": "cache"})
        except TypeError:
            return None

    def put(self, mode: str, choice: Choice) -> None:
        row = asdict(choice)
        row = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
        self.entries[self.key(mode, choice.op, choice.shapes, choice.dtype)] = row
        self.save()

    def save(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"version": self.VERSION, "entries": self.entries}, indent=1))
            os.replace(tmp, self.path)
        except OSError as err:  # a read-only home never stops training
            logger.warning("autoselect: could not write the cache %s: %s", self.path, err)


def _nan_floats(entry: Choice) -> Choice:
    for name in ("pytorch_ms", "triton_ms", "pytorch_spread_ms", "triton_spread_ms", "max_rel_err"):
        if getattr(entry, name) is None:
            setattr(entry, name, math.nan)
    return entry


# --- the selector ----------------------------------------------------------------------------------


@dataclass
class Selector:
    """Decides one key at a time; kept by the :class:`Selection` for keys first seen in training."""

    mode: str = "train"
    timer: Callable | None = None
    cache: AutoselectCache | None = None
    force: dict[str, bool | None] = field(default_factory=dict)
    benchmark_kernels: bool = True
    tie_margin: float = 0.02

    def choose(self, spec: CallSpec, source: str = "timed") -> Choice:
        forced = self.force.get(spec.op)
        try:
            return self._choose(spec, forced, source)
        except AutoselectError:
            raise
        except Exception as err:  # the selector itself failed: PyTorch, and say why
            op, shapes, dtype = spec.key()
            return Choice(
                op, shapes, dtype, self.mode, "pytorch", f"selector error: {err}", source="fallback"
            )

    def _choose(self, spec: CallSpec, forced: bool | None, source: str) -> Choice:
        op_name, shapes, dtype = spec.key()
        op = OPS[op_name]
        base = {"op": op_name, "shapes": shapes, "dtype": dtype, "mode": self.mode}
        if forced is False:
            return Choice(**base, choice="pytorch", reason="forced pytorch", source="forced")
        if forced is None and self.cache is not None:
            hit = self.cache.get(self.mode, spec)
            if hit is not None:
                return _nan_floats(hit)

        def fallback(reason: str) -> Choice:
            if forced:
                raise AutoselectError(
                    f"{op_name}: forced to Triton at {shapes} {dtype}, but it cannot run: {reason}"
                )
            return self._store(Choice(**base, choice="pytorch", reason=reason, source="fallback"))

        why = triton_unavailable(spec.device)
        if why:
            return fallback(why)
        train = self.mode == "train"
        inputs = _make_inputs(spec, train)
        why = op.unsupported(inputs)
        if why:
            return fallback(f"unsupported: {why}")
        ref_inputs = [t.detach().clone().requires_grad_(t.requires_grad) if isinstance(t, Tensor) else t
                      for t in inputs]  # fmt: skip
        torch_step = _make_step(op.pytorch, spec, ref_inputs, train)
        triton_step = _make_step(op.triton, spec, inputs, train)
        ref = torch_step()
        try:
            got = triton_step()
        except ValueError as err:
            return fallback(f"unsupported: {err}")
        except Exception as err:
            return fallback(f"compile/launch error: {type(err).__name__}: {str(err).splitlines()[0][:200]}")
        tol = TOLERANCE.get(getattr(torch, spec.args[0].dtype), 1e-3)
        if spec.autocast:
            tol = max(tol, TOLERANCE.get(getattr(torch, spec.autocast), tol))
        errs = [_rel_err(g, r) for g, r in zip(got, ref, strict=True)]
        worst = max(errs) if errs else 0.0
        if not worst <= tol:
            return fallback(f"disagrees with PyTorch: rel err {worst:.2e} > {tol:g}")
        if forced:
            return Choice(**base, choice="triton", reason="forced triton", max_rel_err=worst, source="forced")
        if not self.benchmark_kernels:
            return self._store(Choice(**base, choice="triton", reason="benchmark_kernels off: runs and agrees",
                                      max_rel_err=worst, source=source))  # fmt: skip
        timer = self.timer or default_timer
        pt_ms, pt_spread = _call_timer(timer, torch_step, Trial(op_name, "pytorch", shapes, dtype, self.mode))
        tr_ms, tr_spread = _call_timer(timer, triton_step, Trial(op_name, "triton", shapes, dtype, self.mode))
        gap = pt_ms - tr_ms
        margin = max(pt_spread, tr_spread, self.tie_margin * min(pt_ms, tr_ms))
        if gap > margin:
            choice, reason = "triton", "triton faster"
        elif -gap > margin:
            choice, reason = "pytorch", "pytorch faster"
        else:
            choice, reason = "pytorch", f"tie within {margin:.3g} ms: pytorch kept"
        return self._store(Choice(**base, choice=choice, reason=reason, pytorch_ms=pt_ms, triton_ms=tr_ms,
                                  pytorch_spread_ms=pt_spread, triton_spread_ms=tr_spread, max_rel_err=worst,
                                  source=source))  # fmt: skip

    def _store(self, choice: Choice) -> Choice:
        if self.cache is not None and choice.source != "forced":
            self.cache.put(self.mode, choice)
        return choice


# --- dispatch: what apply() puts into the model ----------------------------------------------------


class Dispatcher:
    """A callable with an op's signature: looks up the choice for its arguments' key (selecting a new
    key once) and calls Triton's or PyTorch's implementation."""

    def __init__(self, op: str, selection: Selection, original: Callable | None = None):
        self.op, self.selection, self.original = op, selection, original
        self.impl = OPS[op]

    def __call__(self, *args):
        spec = CallSpec.of(self.op, args)
        choice = self.selection.lookup(spec)
        if choice.choice == "triton":
            try:
                return self.impl.triton(*args)
            except Exception as err:
                if choice.source == "forced":
                    raise
                choice.choice, choice.reason, choice.source = (
                    "pytorch",
                    f"launch error in training: {err}",
                    "fallback",
                )
                logger.warning("autoselect: %s at %s fell back to PyTorch: %s", self.op, choice.shapes, err)
        return self.impl.pytorch(*args)


class _Recorder:
    """Stands in for an op while select() runs the forward: notes each distinct call, runs PyTorch."""

    def __init__(self, op: str, seen: dict):
        self.op, self.seen = op, seen

    def __call__(self, *args):
        spec = CallSpec.of(self.op, args)
        self.seen.setdefault(spec.key(), spec)
        return OPS[self.op].pytorch(*args)


class AutoRMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` whose forward goes through the autoselect dispatcher (class swapped in place)."""

    _autoselect: Callable

    def forward(self, x: Tensor) -> Tensor:
        if len(self.normalized_shape) != 1:
            return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)
        return self._autoselect(x, self.weight, self.eps)


def _components_of(model: nn.Module) -> list:
    found = []
    for module in model.modules():
        comps = getattr(module, "components", None)
        is_components = comps is not None and all(hasattr(comps, slot) for slot in COMPONENT_SLOTS)
        if is_components and not any(comps is f for f in found):
            found.append(comps)
    return found


def _install(
    model: nn.Module, ops: tuple[str, ...], make: Callable[[str, Callable | None], Callable]
) -> None:
    for comps in _components_of(model):
        saved = comps.__dict__.setdefault("_autoselect_original", {})
        for slot, op in COMPONENT_SLOTS.items():
            if op in ops:
                saved.setdefault(slot, getattr(comps, slot))
                setattr(comps, slot, make(op, saved[slot]))
        if "rms_norm" in ops and getattr(comps, "add_norm", None) is not None:
            # A fused residual add + norm would keep its norm off the dispatcher: the model adds, then
            # norms through the selected rms_norm (the add is one more kernel; unapply restores it).
            saved.setdefault("add_norm", comps.add_norm)
            comps.add_norm = None
    if "rms_norm" in ops:
        for module in model.modules():
            if isinstance(module, nn.RMSNorm):
                if type(module) is nn.RMSNorm:
                    module.__class__ = AutoRMSNorm
                module._autoselect = make("rms_norm", None)


def unapply(model: nn.Module) -> nn.Module:
    """Undo :func:`apply` (and select()'s recording): the model's own components and nn.RMSNorm."""
    for comps in _components_of(model):
        for slot, fn in comps.__dict__.pop("_autoselect_original", {}).items():
            setattr(comps, slot, fn)
    for module in model.modules():
        if type(module) is AutoRMSNorm:
            module.__class__ = nn.RMSNorm
            module.__dict__.pop("_autoselect", None)
    return model


def apply(model: nn.Module, selection: Selection, ops: Iterable[str] = OP_NAMES) -> nn.Module:
    """Swap the selection's dispatchers into ``model`` in place (returned for chaining): every
    ``nn.RMSNorm`` and the slots of a ``components`` (``LMComponents``) attribute."""
    ops = _check_ops(ops)
    _install(model, ops, lambda op, original: Dispatcher(op, selection, original))
    return model


def _check_ops(ops: Iterable[str]) -> tuple[str, ...]:
    ops = tuple(ops)
    bad = [o for o in ops if o not in OPS]
    if bad:
        raise ValueError(f"ops: unknown {', '.join(map(repr, bad))}; expected any of {', '.join(OP_NAMES)}")
    return ops


def _run_forward(model: nn.Module, example_batch) -> None:
    with torch.no_grad():
        if isinstance(example_batch, dict):
            model(**example_batch)
        elif isinstance(example_batch, tuple | list):
            if len(example_batch) == 2 and hasattr(model, "loss"):
                model.loss(*example_batch)
            else:
                model(*example_batch)
        else:
            model(example_batch)


def _open_cache(cache) -> AutoselectCache | None:
    if cache is False:
        return None
    if isinstance(cache, AutoselectCache):
        return cache
    return AutoselectCache(cache)  # None: the default path


def select(
    model: nn.Module,
    example_batch,
    ops: Iterable[str] = OP_NAMES,
    mode: str = "train",
    timer: Callable | None = None,
    cache: AutoselectCache | str | Path | bool | None = None,
    force: dict[str, bool | None] | None = None,
    *,
    benchmark_kernels: bool = True,
    tie_margin: float = 0.02,
    log: bool = True,
) -> Selection:
    """Time Triton against PyTorch for every op ``model`` calls on ``example_batch`` (a tensor, a
    tuple -- ``(tokens, targets)`` goes through ``model.loss`` when there is one -- or a dict of
    keyword arguments) and return the :class:`Selection`. Call it under the autocast the training
    uses. See the module docstring for the rules; :func:`apply` swaps the choices in."""
    ops = _check_ops(ops)
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
    force = dict(force or {})
    bad = [k for k in force if k not in OPS]
    if bad:
        raise ValueError(
            f"force: unknown op {', '.join(map(repr, bad))}; expected any of {', '.join(OP_NAMES)}"
        )
    for k, v in force.items():
        if v not in (True, False, None):
            raise ValueError(f"force: {k} must be True, False or None, got {v!r}")
    started = time.perf_counter()
    selector = Selector(mode, timer, _open_cache(cache), force, benchmark_kernels, tie_margin)
    seen: dict[tuple, CallSpec] = {}
    _install(model, ops, lambda op, original: _Recorder(op, seen))
    try:
        _run_forward(model, example_batch)
    finally:
        unapply(model)
    selection = Selection(selector=selector, forward_s=time.perf_counter() - started)
    for key, spec in seen.items():
        choosing = time.perf_counter()
        selection.choices[key], selection.specs[key] = selector.choose(spec), spec
        selection.select_s[key] = time.perf_counter() - choosing
    selection.startup_s = time.perf_counter() - started
    if log:
        selection.log()
    return selection


def verify(selection: Selection, timer: Callable | None = None) -> list[dict]:
    """Re-time both implementations of every timed choice, independently of the selection (fresh
    inputs, a second timing), and say whether the pick still holds: ``wrong_pick`` is True when the
    other implementation is faster by more than the larger spread and the tie margin."""
    out = []
    selector = selection.selector or Selector()
    timer = timer or default_timer
    train = selector.mode == "train"
    for key, choice in selection.choices.items():
        spec = selection.specs.get(key)
        if spec is None or math.isnan(choice.triton_ms) or math.isnan(choice.pytorch_ms):
            continue
        op = OPS[spec.op]
        times = {}
        for impl in ("pytorch", "triton"):
            step = _make_step(getattr(op, impl), spec, _make_inputs(spec, train, seed=7), train)
            times[impl] = _call_timer(timer, step, Trial(spec.op, impl, *key[1:], selector.mode))
        (pt, pt_s), (tr, tr_s) = times["pytorch"], times["triton"]
        margin = max(pt_s, tr_s, selector.tie_margin * min(pt, tr))
        faster = "triton" if pt - tr > margin else "pytorch" if tr - pt > margin else "tie"
        out.append(
            {
                **choice.row(),
                "select_s": selection.select_s.get(key, math.nan),
                "retime_pytorch_ms": pt,
                "retime_triton_ms": tr,
                "retime_spread_ms": max(pt_s, tr_s),
                "retime_faster": faster,
                "wrong_pick": faster not in ("tie", choice.choice),
            }
        )
    return out


__all__ = [
    "MODES",
    "OPS",
    "OP_NAMES",
    "TOLERANCE",
    "AutoRMSNorm",
    "AutoselectCache",
    "AutoselectError",
    "CallSpec",
    "Choice",
    "Dispatcher",
    "Selection",
    "Selector",
    "Trial",
    "apply",
    "default_cache_path",
    "default_timer",
    "select",
    "triton_unavailable",
    "unapply",
    "verify",
]
