"""One training step of a model, measured: median step time, per-stage times, tokens/s, peak memory."""

import argparse
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
from .timing import StageTimer

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
