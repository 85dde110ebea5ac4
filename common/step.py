"""One training step of a model, measured: median step time, per-stage times, tokens/s, peak memory,
and the GPU's time by kernel family (``profile_gpu_time``)."""

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar, Self

import torch

from tritonlab.models import (
    DTYPES,
    SHAPES,
    Components,
    TNPConfig,
    TNPShape,
    build,
    check_dtype,
    resolve_shape,
    sample_tasks,
    train_step,
)

from .cli import parse_phase_args, phase_parser, require_at_least
from .device import DEVICE, ON_GPU
from .memory import measure_peak_memory
from .timing import StageTimer, cuda_kernel_events

# The large shape takes seconds a step: its cells run at most this many timed and warm-up steps.
AT_LARGE = {"steps": 3, "warmup": 1}


@dataclass
class StepResult:
    step_ms: float
    step_p20_ms: float
    step_p80_ms: float
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    tokens_per_s: float
    peak_mem_gb: float
    steps: int
    loss: float

    def as_row(self) -> dict:
        return dict(self.__dict__)


def measure_training_step(
    cfg: TNPConfig,
    components: Components,
    shape: TNPShape,
    dtype_name: str,
    *,
    compile_model: bool = False,
    warmup: int = 2,
    steps: int = 5,
    seed: int = 0,
    checkpoint: str = "none",
) -> StepResult:
    """Median step time and per-stage times over ``steps`` training steps after ``warmup`` ones.

    The warm-up steps absorb torch.compile's compilation and the kernels' autotuning; the peak
    memory covers warm-up and timed steps alike, so it includes AdamW's state. ``checkpoint`` is the
    model's activation checkpointing (one of ``tritonlab.models.CHECKPOINT_MODES``).
    """
    dtype = check_dtype(dtype_name)
    device = DEVICE
    generator = torch.Generator(device=device).manual_seed(seed)
    tasks = sample_tasks(
        shape.batch, shape.m_context, shape.n_target, x_dim=cfg.x_dim, device=device, generator=generator
    )
    with measure_peak_memory() as mem:
        model, optimizer = build(cfg, components, seed, device, checkpoint=checkpoint)
        if compile_model:
            # A fresh, static compilation per cell: after a second shape dynamo would otherwise
            # recompile with dynamic shapes, a different (and here failing) program.
            torch._dynamo.reset()
            loss_fn = torch.compile(model.loss, dynamic=False)
        else:
            loss_fn = model.loss
        for _ in range(warmup):
            train_step(model, loss_fn, optimizer, tasks, dtype)
        timer = StageTimer()
        for _ in range(steps):
            loss = train_step(model, loss_fn, optimizer, tasks, dtype, timer)
        stages = timer.summary()
    step = stages["step"]
    return StepResult(
        step_ms=step.ms,
        step_p20_ms=step.p20_ms,
        step_p80_ms=step.p80_ms,
        forward_ms=stages["forward"].ms,
        backward_ms=stages["backward"].ms,
        optimizer_ms=stages["optimizer"].ms,
        tokens_per_s=shape.tokens / (step.ms / 1e3),
        peak_mem_gb=mem.peak_gb,
        steps=steps,
        loss=float(loss),
    )


def step_parser(
    phase: str,
    description: str,
    *,
    steps: tuple[int, int] = (20, 2),
    warmup: tuple[int, int] = (3, 1),
    before: str = "",
    after: str = "",
) -> argparse.ArgumentParser:
    """The parser of a phase that times the TransformerNP's training step: --shape over the model's
    shapes (small and mid on a GPU, tiny on the CPU), --dtype (bf16 is autocast), --batch, and
    --steps and --warmup with (GPU, CPU) defaults (by default :class:`StepSetup`'s on a GPU);
    ``before`` and ``after`` frame the epilog's shapes."""
    parser = phase_parser(
        phase,
        description,
        shapes=list(SHAPES),
        gpu_shapes=("small", "mid"),
        cpu_shapes=("tiny",),
        dtypes=list(DTYPES),
        default_dtype="bf16",
        epilog=before
        + "shapes: "
        + "; ".join(s.label() for s in SHAPES.values())
        + ". --dtype bf16 is autocast over fp32 weights."
        + after,
    )
    parser.add_argument("--batch", type=int, default=None, help="override every shape's batch size")
    count_argument(parser, "steps", "timed steps", steps, AT_LARGE["steps"])
    count_argument(parser, "warmup", "untimed steps first", warmup, AT_LARGE["warmup"])
    return parser


def count_argument(
    parser: argparse.ArgumentParser, name: str, what: str, defaults: tuple[int, int], at_large: int
) -> None:
    """``--<name>`` (underscores as dashes): a count, ``what`` it counts, with (GPU, CPU) ``defaults``;
    the help says the cap the large shape puts on it (:attr:`StepSetup.at_large`)."""
    gpu, cpu = defaults
    parser.add_argument(
        f"--{name.replace('_', '-')}",
        type=int,
        default=gpu if ON_GPU else cpu,
        help=f"{what} (default {gpu}, at most {at_large} at large; {cpu} on the CPU)",
    )


def parse_step_args(parser: argparse.ArgumentParser, argv, minimums: dict[str, int]) -> argparse.Namespace:
    """Parse (``common.cli.parse_phase_args``), refuse a count below its least value (``minimums``;
    ``--batch`` at least 1) and put ``--shape``'s shapes, ``--batch`` applied, in ``args.shapes``."""
    args = parse_phase_args(parser, argv)
    require_at_least(parser, args, {**minimums, "batch": 1})
    args.shapes = resolve_shapes(parser, args)
    return args


@dataclass(frozen=True)
class StepSetup:
    """What every cell of a training-step phase's run shares: the model, the dtype, the timed and
    warm-up steps and the seed; a phase's subclass adds its own counts, and caps them at the large
    shape in ``at_large``."""

    cfg: TNPConfig
    dtype: str
    steps: int = 20
    warmup: int = 3
    seed: int = 0
    at_large: ClassVar[dict[str, int]] = AT_LARGE

    def for_shape(self, shape: TNPShape) -> Self:
        """This setup at ``shape``: at large, every count of ``at_large`` at most its cap there."""
        if shape.name != "large":
            return self
        return replace(self, **{name: min(getattr(self, name), cap) for name, cap in self.at_large.items()})


def shape_columns(cfg: TNPConfig, shape: TNPShape) -> dict:
    """The row columns that say which model and shape a training-step cell ran."""
    return {
        "n_layers": cfg.n_layers,
        "d_model": cfg.d_model,
        "m_context": shape.m_context,
        "n_target": shape.n_target,
        "batch": shape.batch,
        "tokens": shape.tokens,
    }


def resolve_shapes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[TNPShape]:
    """``--shape``'s shapes with ``--batch`` applied; a value they reject is argparse's error."""
    try:
        return [resolve_shape(name, args.batch) for name in args.shape]
    except ValueError as err:
        parser.error(str(err))


def variant_label(variant: str, checkpoint: str, graphs: bool) -> str:
    """A TransformerNP step variant's row name: ``variant``, then ``+ckpt-<mode>`` and ``+graphs``
    where those toggles are on (phase 12's rows; the Slurm matrix owes one per cell)."""
    return variant + ("" if checkpoint == "none" else f"+ckpt-{checkpoint}") + ("+graphs" if graphs else "")


# The CUDA-graph toggles phase 12 and its Slurm matrix run by default, per shape: the small step is
# bound by the host, so its headline needs its cells graphed (1.30x the best baseline, against 1.04x
# without); at mid and large a graph moves the step by about 1% or less (phase 10), so they run without.
DEFAULT_GRAPHS = {"small": ("off", "on")}


def default_graphs(shape: str) -> tuple[str, ...]:
    """The graph toggles ("off", "on") a shape runs when none are asked for (``DEFAULT_GRAPHS``)."""
    return DEFAULT_GRAPHS.get(shape, ("off",))


# --- the GPU's time by kernel family -----------------------------------------------------------------

# (row column suffix, pattern), first match wins: the names of tritonlab's, cuDNN's, cuBLAS's,
# Inductor's and ATen's kernels in a TransformerNP step.
KERNEL_FAMILIES = (
    ("inductor", r"^triton_"),  # first: its names carry the ops they fuse (silu_backward, ...)
    ("attention", r"attn|flash|fmha|sdpa|_delta_kernel|dkdv|_dq_kernel|_fused_bwd|dot_do_o|convert_dq"),
    ("mlp", r"^_fused_mlp_staged_kernel|^_silu_backward_kernel"),
    # tritonlab._gemm's kernels: the grouped heads run them (the model's fused MLP does not).
    ("heads", r"^fused_mlp_fwd_kernel|^mlp_hidden_kernel"),
    ("loss", r"^_gmm_nll"),
    ("optimizer", r"adam|multi_tensor"),
    ("gemm", r"gemm|nvjet|cutlass|xmma|sm90_|splitK"),
    ("memcpy", r"^Memcpy|^Memset"),
    ("elementwise", r"at::native|elementwise|reduce_kernel"),
)


def kernel_family(name: str) -> str:
    """The family of a kernel name (``KERNEL_FAMILIES``), "other" if none matches."""
    for family, pattern in KERNEL_FAMILIES:
        if re.search(pattern, name, re.IGNORECASE):
            return family
    return "other"


def summarize_kernels(kernels: list[tuple[str, float, float]], steps: int) -> dict:
    """Per step, from (name, start_us, end_us) kernel intervals: ``gpu_busy_ms`` (the union of the
    intervals: the time the GPU ran anything), ``gpu_kernel_ms`` (their sum), ``gpu_launches`` and
    ``gpu_<family>_ms`` for every family of ``KERNEL_FAMILIES`` and "other"."""
    per_family = dict.fromkeys([f for f, _ in KERNEL_FAMILIES] + ["other"], 0.0)
    busy, reach = 0.0, float("-inf")
    for name, start, end in sorted(kernels, key=lambda k: k[1]):
        per_family[kernel_family(name)] += end - start
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    row = {
        "gpu_busy_ms": busy / 1e3 / steps,
        "gpu_kernel_ms": sum(per_family.values()) / 1e3 / steps,
        "gpu_launches": len(kernels) / steps,
    }
    return row | {f"gpu_{family}_ms": us / 1e3 / steps for family, us in per_family.items()}


def profile_gpu_time(step: Callable[[], object], steps: int) -> dict:
    """``summarize_kernels`` of ``steps`` calls of ``step`` under ``torch.profiler`` (CUDA only; {}
    without CUDA or with no steps). Kernels replayed from a CUDA graph count like launched ones."""
    if steps <= 0 or not torch.cuda.is_available():
        return {}
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = [(e.name, e.time_range.start, e.time_range.end) for e in cuda_kernel_events(prof.events())]
    return summarize_kernels(kernels, steps)
