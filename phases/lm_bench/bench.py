"""The cells of lm_bench's parts: one model size, context, mode and dtype per timed cell.

A timed cell builds the model on the device, runs ``warmup`` untimed steps, then ``steps`` timed
ones, each between two ``torch.cuda.synchronize()`` calls and read off the host clock, as the
course's benchmarking script does; the row keeps the mean, the standard deviation and every step's
time (``step_times_ms``, ';'-joined). Building the model and the steps run inside
``measure_peak_memory``, so an out-of-memory anywhere in the cell is a row with status "oom".
"""

import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch
from torch import nn

from common import DEVICE, Cell, check_close, measure_peak_memory
from common.device import autocast as device_autocast
from common.device import synchronize as sync
from tritonlab.models import (  # the library's LM, as its package exports it: a declaration, not logic
    LM_ATTENTIONS,
    LM_SIZES,
    LMComponents,
    TransformerLM,
    lm_config,
    our_components,
    param_count,
    random_batch,
    torch_components,
)
from tritonlab.testing import rel_err

MODES = ("forward", "forward-backward", "train")
DTYPES = {"fp32": None, "bf16": torch.bfloat16}
GPU_SIZES = ("small", "medium", "large", "xl", "2.7B")
GPU_CONTEXTS = (128, 256, 512, 1024)
CPU_SIZES = ("tiny",)
CPU_CONTEXTS = (32,)
CPU_MAX_CONTEXT = 64
WARMUP_STEPS = (0, 1, 2, 5)
# The baselines of `ours`: eager with the course's naive attention and with PyTorch's SDPA, and the
# SDPA model's loss under torch.compile. "+flce" puts the fused linear cross-entropy head (no full
# logits) on ours; "+graphs" replays ours' whole train step (forward, backward, AdamW) from one CUDA
# graph (tritonlab.graphs.GraphedStep), which takes the host out of the step.
# "mixed+graphs": the same graphed step with PyTorch's SDPA attention in place of flash2's.
# "compile-ro-sdpa": the SDPA model's loss under torch.compile(mode="reduce-overhead"), Inductor's own
# CUDA graphs: the compiled counterpart of the graphed steps. "mixed+shadows+graphs": mixed+graphs
# stepping tritonlab.optim.AdamW, which also writes the bf16 copies of the linear weights that the
# forward then reads instead of casting them (tritonlab.optim.WeightShadows); every other variant
# steps PyTorch's AdamW (--optimizer).
OURS_VARIANTS = (
    "eager-naive",
    "eager-sdpa",
    "compile-sdpa",
    "compile-ro-sdpa",
    "ours",
    "ours+flce",
    "ours+graphs",
    "mixed+graphs",
    "mixed+shadows+graphs",
)
# PyTorch's AdamW as a user would pick it: "foreach" (the default: multi-tensor kernels, several
# passes over the weights and moments) or "fused" (one pass). On the H100 the foreach step took
# 28.4 ms of a 90 ms large train step at context 1024. `--optimizer` picks it; the ours part times
# every variant with the fused one, the timing and warm-up parts keep the course's default.
OPTIMIZERS = ("foreach", "fused")
LR = 1e-4  # every train step's AdamW, PyTorch's or tritonlab's: one learning rate, the rest defaults
# Loss and gradient agreement of `ours` with PyTorch's components (relative, over the whole tensor).
CHECK_TOL = {"fp32": (1e-4, 1e-3), "bf16": (2e-2, 6e-2)}


def autocast(dtype: str):
    """bf16: autocast over the fp32 weights; fp32: nothing."""
    return device_autocast(DTYPES[dtype])


# torch.compile's mode for each compiled variant's prefix (the longer prefix first).
COMPILE_MODES = {"compile-ro-": "reduce-overhead", "compile-": "default"}


def compile_mode(variant: str) -> tuple[str, str] | None:
    """(prefix, torch.compile mode) of a ``compile-`` variant, None for an eager one."""
    return next(((p, m) for p, m in COMPILE_MODES.items() if variant.startswith(p)), None)


def components_for(variant: str, shadows=None) -> LMComponents:
    """``ours`` (``+graphs``: the same components), ``mixed`` (ours with SDPA attention),
    ``eager-<attention>``, ``compile-<attention>`` or ``compile-ro-<attention>``, any with
    ``+flce``: the fused linear cross-entropy head. ``shadows`` (``+shadows``): our linear layers
    read the current bf16 copies it holds."""
    base = variant.removesuffix("+graphs").removesuffix("+shadows").removesuffix("+flce")
    head = "fused" if variant.endswith("+flce") else "logits"
    if base == "ours":
        return our_components(head=head, shadows=shadows)
    if base == "mixed":
        return replace(our_components(head=head, shadows=shadows), attention=LM_ATTENTIONS["sdpa"])
    compiled = compile_mode(base)
    attention = base.removeprefix(compiled[0]) if compiled else base.split("-", 1)[1]
    return torch_components(attention, head=head)


def skip_reason(variant: str, mode: str) -> str | None:
    """Why ``variant`` has no ``mode`` cell here (a "skipped" row), or None."""
    if variant.endswith("+graphs") and mode != "train":
        return f"{variant}: the CUDA graph captures the whole train step; mode {mode} has no graphed form"
    if variant.endswith("+graphs") and DEVICE.type != "cuda":
        return f"{variant}: CUDA graphs need a CUDA GPU"
    if compile_mode(variant) and DEVICE.type != "cuda":
        return f"{variant}: torch.compile is timed on a GPU only (the CPU run stays a quick check)"
    return None


@dataclass
class Plan:
    """One timed cell."""

    variant: str  # one of OURS_VARIANTS (timing and warmup: eager-naive or eager-sdpa)
    size: str
    context: int
    mode: str
    dtype: str
    batch: int
    warmup: int
    steps: int
    optimizer: str = "foreach"  # one of OPTIMIZERS: the train step's AdamW


def adamw(model: TransformerLM, optimizer: str, **options) -> torch.optim.AdamW:
    """The train step's AdamW over ``model``'s parameters, ``optimizer`` one of :data:`OPTIMIZERS`."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer: expected one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    return torch.optim.AdamW(model.parameters(), lr=LR, fused=optimizer == "fused", **options)


def _optimizer(model: TransformerLM, plan: Plan, shadows, **options) -> torch.optim.Optimizer:
    """The plan's PyTorch AdamW, or with ``shadows`` tritonlab's, which writes them (same lr, betas,
    eps and weight decay: PyTorch's defaults)."""
    if shadows is None:
        return adamw(model, plan.optimizer, **options)
    from tritonlab.optim import AdamW

    return AdamW(model.parameters(), lr=LR, shadows=shadows)


def make_step(model: TransformerLM, plan: Plan, shadows=None) -> Callable[[], None]:
    """One step of ``plan.mode`` on a fixed random batch: forward only (no autograd graph kept),
    forward and backward, or forward, backward and AdamW (``+graphs``: that train step captured in
    one CUDA graph after ``plan.warmup`` warm-up steps, and replayed; ``shadows``: the model's bf16
    weight copies, which tritonlab's AdamW then writes)."""
    tokens, targets = random_batch(model.cfg, plan.batch, plan.context, device=DEVICE)
    if plan.variant.endswith("+graphs"):
        return _graphed_step(model, plan, tokens, targets, shadows)
    optimizer = _optimizer(model, plan, shadows) if plan.mode == "train" else None

    # Inductor's CUDA graphs (reduce-overhead) reuse their output buffers: each step says it is a new
    # iteration, so none of the last step's outputs is taken as still alive.
    compiled = compile_mode(plan.variant)
    new_iteration = compiled is not None and compiled[1] == "reduce-overhead"

    def step() -> None:
        if new_iteration:
            torch.compiler.cudagraph_mark_step_begin()
        if plan.mode == "forward":
            with torch.no_grad(), autocast(plan.dtype):
                model.loss(tokens, targets)
            return
        with autocast(plan.dtype):
            loss = model.loss(tokens, targets)
        loss.backward()
        if optimizer is not None:
            optimizer.step()
        model.zero_grad(set_to_none=True)

    return step


def _graphed_step(model: TransformerLM, plan: Plan, tokens, targets, shadows=None) -> Callable[[], None]:
    """The train step as one CUDA graph: the plan's AdamW with ``capturable=True``, its state on
    the GPU. The graph's warm-up steps (which tune our kernels)
    train on the batch and are not undone (``restore=False``): undoing them copies the weights and
    AdamW's state to host memory and back, 41 GB at 2.7B, and the timing does not depend on them."""
    from tritonlab.graphs import GraphedStep

    optimizer = _optimizer(model, plan, shadows, capturable=True)
    graphed = GraphedStep(model, optimizer, model.loss, (tokens, targets), warmup=max(plan.warmup, 1),
                          autocast_dtype=DTYPES[plan.dtype], restore=False)  # fmt: skip

    def step() -> None:
        graphed.step(tokens, targets)

    return step


def time_steps(step: Callable[[], None], warmup: int, steps: int) -> list[float]:
    """Milliseconds of each of ``steps`` timed steps after ``warmup`` untimed ones, synchronizing
    before and after every timed step."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        sync()
        started = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - started) * 1e3)
    return times


def step_row(times: list[float], plan: Plan) -> dict:
    mean = statistics.fmean(times)
    return {
        "mean_ms": mean,
        "std_ms": statistics.stdev(times) if len(times) > 1 else 0.0,
        "min_ms": min(times),
        "max_ms": max(times),
        "first_ms": times[0],
        "rest_mean_ms": statistics.fmean(times[1:]) if len(times) > 1 else times[0],
        "tokens_per_s": plan.batch * plan.context / (mean * 1e-3),
        "step_times_ms": ";".join(f"{t:.4f}" for t in times),
    }


def _new_shadows(variant: str):
    """An empty ``WeightShadows`` for a ``+shadows`` variant (the model's weights added once it
    exists), else None."""
    if "+shadows" not in variant:
        return None
    from tritonlab.optim import WeightShadows

    return WeightShadows()


def run_plan(plan: Plan) -> dict:
    """Build the model on the device, time its steps, return the row's measurements. ``compile-``:
    the model's loss (forward and cross-entropy) under ``torch.compile``, compiled by the first
    warm-up step; ``+graphs``: the graph's warm-up and capture happen before the warm-up steps."""
    reason = skip_reason(plan.variant, plan.mode)
    if reason:
        return {"status": "skipped", "error": reason}
    cfg = lm_config(plan.size, plan.context)
    compiled = compile_mode(plan.variant)
    if compiled:
        torch._dynamo.reset()  # a fresh model must not hit the recompile limit and fall back to eager
    with measure_peak_memory() as mem:
        torch.manual_seed(0)
        shadows = _new_shadows(plan.variant)
        with DEVICE:
            model = TransformerLM(cfg, components_for(plan.variant, shadows))
        if shadows is not None:
            shadows.add(p for p in model.parameters() if p.dim() == 2)  # the linear layers' weights
        if compiled:
            model.loss = torch.compile(model.loss, mode=compiled[1])
        # A compiled model's first step compiles it, and reduce-overhead records its graphs in the
        # next ones: never a timed step.
        warmup = plan.warmup if not compiled else max(plan.warmup, 1 if compiled[1] == "default" else 3)
        times = time_steps(make_step(model, plan, shadows), warmup, plan.steps)
    return {**step_row(times, plan), "peak_mem_gb": mem.peak_gb}


def plan_cell(plan: Plan, **extra) -> Cell:
    columns = {
        "size": plan.size,
        "context": plan.context,
        "mode": plan.mode,
        "batch": plan.batch,
        "warmup": plan.warmup,
        "steps": plan.steps,
        "params": param_count(LM_SIZES[plan.size]),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "optimizer": plan.optimizer if plan.mode == "train" else "none",
        **extra,
    }
    return Cell(plan.variant, plan.size, plan.dtype, lambda: run_plan(plan), columns)


def timing_cells(
    sizes, contexts, modes, dtypes, *, batch, warmup, steps, attention="naive", optimizer="foreach"
) -> list[Cell]:
    """Every size x context x mode x dtype, PyTorch's components with ``attention``."""
    return [
        plan_cell(
            Plan(f"eager-{attention}", size, context, mode, dtype, batch, warmup, steps, optimizer),
            part="timing",
        )
        for dtype in dtypes
        for size in sizes
        for context in contexts
        for mode in modes
    ]


def warmup_cells(
    sizes, contexts, modes, dtypes, *, batch, steps, attention="naive", optimizer="foreach"
) -> list[Cell]:
    """Each cell at 0, 1, 2 and 5 warm-up steps. The 0-step cell of each (size, context, mode,
    dtype) runs first, so it meets that model's shapes cold; ``process_cold`` marks the very first
    cell of the run, the only one that also pays for CUDA's and cuBLAS's start-up."""
    cells = []
    for dtype in dtypes:
        for size in sizes:
            for context in contexts:
                for mode in modes:
                    for warmup in WARMUP_STEPS:
                        plan = Plan(f"eager-{attention}", size, context, mode, dtype, batch, warmup, steps,
                                    optimizer)  # fmt: skip
                        cells.append(plan_cell(plan, part="warmup", process_cold=not cells))
    return cells


# --- ours: the same model with our kernels ---------------------------------------------------------


def check_ours(size: str, context: int, dtype: str, batch: int) -> dict:
    """Loss and every parameter gradient of the model on our kernels against PyTorch's components
    (naive attention), same weights and batch; raises (an error row) beyond :data:`CHECK_TOL`."""
    cfg = lm_config(size, context)
    tokens, targets = random_batch(cfg, batch, context, device=DEVICE)
    results = []
    with measure_peak_memory() as mem:
        for components in (torch_components("naive"), our_components()):
            torch.manual_seed(0)
            with DEVICE:
                model = TransformerLM(cfg, components)
            with autocast(dtype):
                loss = model.loss(tokens, targets)
            loss.backward()
            results.append((loss.detach().float(), [p.grad.float() for p in model.parameters()]))
            del model, loss
    (ref_loss, ref_grads), (our_loss, our_grads) = results
    loss_err = rel_err(our_loss, ref_loss)
    grad_err = max(rel_err(g, r) for g, r in zip(our_grads, ref_grads, strict=True))
    loss_tol, grad_tol = CHECK_TOL[dtype]
    row = {
        "loss": ref_loss.item(),
        "loss_rel_err": loss_err,
        "grad_rel_err": grad_err,
        "peak_mem_gb": mem.peak_gb,
    }
    check_close("loss", loss_err, loss_tol)
    check_close("gradients (worst parameter)", grad_err, grad_tol)
    return row


def ours_cells(
    sizes, contexts, modes, dtypes, *, batch, warmup, steps, variants=OURS_VARIANTS, optimizer="fused"
) -> Iterator[Cell]:
    """Per dtype and size: the correctness check (variant ``check``, at the first context), then
    every context x mode timed for each variant side by side."""
    for dtype in dtypes:
        for size in sizes:
            check_columns = {
                "size": size,
                "context": contexts[0],
                "mode": "check",
                "batch": batch,
                "part": "ours",
            }
            yield Cell(
                "check",
                size,
                dtype,
                lambda s=size, d=dtype: check_ours(s, contexts[0], d, batch),
                check_columns,
            )
            for context in contexts:
                for mode in modes:
                    for variant in variants:
                        plan = Plan(variant, size, context, mode, dtype, batch, warmup, steps, optimizer)
                        yield plan_cell(plan, part="ours")


def ours_total(sizes, contexts, modes, dtypes, variants=OURS_VARIANTS) -> int:
    return len(dtypes) * len(sizes) * (1 + len(contexts) * len(modes) * len(variants))


# --- precision: the accumulation experiment and the dtypes under autocast -------------------------


def accumulation_rows() -> list[dict]:
    """The course's experiment: add 0.01 a thousand times (exactly 10), in four ways."""

    def accumulate(acc_dtype, add_dtype, cast: bool) -> float:
        s = torch.tensor(0.0, dtype=acc_dtype, device=DEVICE)
        for _ in range(1000):
            x = torch.tensor(0.01, dtype=add_dtype, device=DEVICE)
            s += x.type(acc_dtype) if cast else x
        return s.item()

    cases = [
        ("fp32 += fp32", "fp32", torch.float32, torch.float32, False),
        ("fp16 += fp16", "fp16", torch.float16, torch.float16, False),
        ("fp32 += fp16", "fp16", torch.float32, torch.float16, False),
        ("fp32 += fp16.type(fp32)", "fp16", torch.float32, torch.float16, True),
    ]
    rows = []
    for name, dtype, acc, add, cast in cases:
        value = accumulate(acc, add, cast)
        rows.append({"variant": name, "dtype": dtype, "value": value, "abs_err": abs(value - 10.0)})
    return rows


class ToyModel(nn.Module):
    """The course's toy model: Linear, ReLU, LayerNorm, Linear."""

    def __init__(self, in_features: int = 16, out_features: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x):
        self.seen = {"fc1 output": (h := self.fc1(x)).dtype}
        h = self.relu(h)
        self.seen["layer norm output"] = (h := self.ln(h)).dtype
        return self.fc2(h)


def autocast_dtype_rows() -> list[dict]:
    """The dtypes of the toy model's parameters, activations, logits, loss and gradients under bf16
    autocast (on the CPU, CPU autocast: the same policy for these ops)."""
    torch.manual_seed(0)
    with DEVICE:
        model = ToyModel()
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        seen = {"parameters (fc1.weight)": model.fc1.weight.dtype}
        logits = model(x)
        seen.update(model.seen)
        seen["logits"] = logits.dtype
        loss = nn.functional.cross_entropy(logits, y)
        seen["loss"] = loss.dtype
    loss.backward()
    seen["gradients (fc1.weight.grad)"] = model.fc1.weight.grad.dtype
    seen["gradients (ln.weight.grad)"] = model.ln.weight.grad.dtype
    return [
        {
            "variant": "autocast-bf16",
            "dtype": "bf16",
            "tensor": name,
            "seen_dtype": str(dt).removeprefix("torch."),
        }
        for name, dt in seen.items()
    ]
