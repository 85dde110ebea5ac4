"""One training step (forward, backward, AdamW) and its measurement, reused by later phases."""

import contextlib
from dataclasses import dataclass

import torch

from common import ON_GPU, StageTimer, TNPShape, measure_peak_memory

from .data import Tasks, sample_tasks
from .model import Components, TNPConfig, TransformerNP

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def check_dtype(name: str) -> torch.dtype | None:
    """The autocast dtype for ``--dtype``: bf16 autocast over fp32 weights, or plain fp32 (None)."""
    if name not in DTYPES:
        raise ValueError(f"dtype: unsupported {name!r}; expected one of {', '.join(DTYPES)}")
    return DTYPES[name] if DTYPES[name] != torch.float32 else None


def build(cfg: TNPConfig, components: Components, seed: int = 0, device=None) -> tuple:
    """A freshly initialised model and its fused AdamW, the same weights for the same seed."""
    torch.manual_seed(seed)
    model = TransformerNP(cfg, components).to(device or ("cuda" if ON_GPU else "cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, fused=ON_GPU)
    return model, optimizer


def autocast(dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast("cuda" if ON_GPU else "cpu", dtype=dtype)


def train_step(
    model, loss_fn, optimizer, tasks: Tasks, dtype: torch.dtype | None, timer: StageTimer | None = None
) -> torch.Tensor:
    """Forward, backward and optimizer step; ``loss_fn`` is ``model.loss`` or its compiled form."""
    stage = timer.stage if timer else (lambda _: contextlib.nullcontext())
    with stage("step"):
        with stage("forward"), autocast(dtype):
            loss = loss_fn(*tasks)
        with stage("backward"):
            loss.backward()
        with stage("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return loss.detach()


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
) -> StepResult:
    """Median step time and per-stage times over ``steps`` training steps after ``warmup`` ones.

    The warm-up steps absorb torch.compile's compilation and the kernels' autotuning; the peak
    memory covers warm-up and timed steps alike, so it includes AdamW's state.
    """
    dtype = check_dtype(dtype_name)
    device = "cuda" if ON_GPU else "cpu"
    generator = torch.Generator(device=device).manual_seed(seed)
    tasks = sample_tasks(
        shape.batch, shape.m_context, shape.n_target, x_dim=cfg.x_dim, device=device, generator=generator
    )
    with measure_peak_memory() as mem:
        model, optimizer = build(cfg, components, seed, device)
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


def train_loss_curve(
    cfg: TNPConfig,
    components: Components,
    shape: TNPShape,
    dtype_name: str,
    *,
    steps: int,
    log_every: int,
    seed: int = 0,
    lr: float = 3e-4,
):
    """Train on fresh tasks each step; yields (step, loss) every ``log_every`` steps."""
    dtype = check_dtype(dtype_name)
    device = "cuda" if ON_GPU else "cpu"
    generator = torch.Generator(device=device).manual_seed(seed + 1)
    model, optimizer = build(cfg, components, seed, device)
    for group in optimizer.param_groups:
        group["lr"] = lr
    running = []
    for step in range(1, steps + 1):
        tasks = sample_tasks(
            shape.batch, shape.m_context, shape.n_target, x_dim=cfg.x_dim, device=device, generator=generator
        )
        running.append(train_step(model, model.loss, optimizer, tasks, dtype))
        if step % log_every == 0 or step == steps:
            yield step, float(torch.stack(running).mean())
            running = []
