"""One training step of the TransformerNP (forward, backward, AdamW), and a loss curve."""

import contextlib

import torch

from .._runtime import preload
from .data import Tasks, sample_tasks
from .shapes import TNPShape
from .tnp import Components, TNPConfig, TransformerNP

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def check_dtype(name: str) -> torch.dtype | None:
    """The autocast dtype for ``--dtype``: bf16 autocast over fp32 weights, or plain fp32 (None)."""
    if name not in DTYPES:
        raise ValueError(f"dtype: unsupported {name!r}; expected one of {', '.join(DTYPES)}")
    return DTYPES[name] if DTYPES[name] != torch.float32 else None


def build(
    cfg: TNPConfig, components: Components, seed: int = 0, device=None, *, checkpoint: str = "none"
) -> tuple:
    """A freshly initialised model and its fused AdamW, the same weights for the same seed;
    ``checkpoint`` is the model's activation checkpointing (``TransformerNP``'s argument)."""
    torch.manual_seed(seed)
    device = torch.device(device or default_device())
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.init()  # preload warms PyTorch on an initialised device only: this one
            preload()  # Triton's and PyTorch's once-per-process start-up, beside the model's construction
    model = TransformerNP(cfg, components, checkpoint).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, fused=device.type == "cuda")
    return model, optimizer


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def autocast(dtype: torch.dtype | None, device_type: str | None = None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type or default_device(), dtype=dtype)


def train_step(
    model, loss_fn, optimizer, tasks: Tasks, dtype: torch.dtype | None, timer=None
) -> torch.Tensor:
    """Forward, backward and optimizer step; ``loss_fn`` is ``model.loss`` or its compiled form.
    ``timer``, if given, has a ``stage(name)`` context manager around each stage (a StageTimer)."""
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
    device = default_device()
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
