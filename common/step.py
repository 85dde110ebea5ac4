"""One training step of a model, measured: median step time, per-stage times, tokens/s, peak memory."""

from dataclasses import dataclass

import torch

from tritonlab.models import Components, TNPConfig, TNPShape, build, check_dtype, sample_tasks, train_step

from .device import DEVICE
from .memory import measure_peak_memory
from .timing import StageTimer


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
