"""Phase 01: the TransformerNP on PyTorch SDPA -- the model every later phase plugs kernels into."""

from .data import Tasks, sample_tasks
from .model import (
    SDPA_BACKENDS,
    Components,
    TNPConfig,
    TransformerNP,
    gmm_heads_loop,
    gmm_nll,
    mlp_eager,
    sdpa_attention,
)
from .training import build, measure_training_step, train_loss_curve, train_step

__all__ = [
    "SDPA_BACKENDS",
    "Components",
    "TNPConfig",
    "Tasks",
    "TransformerNP",
    "build",
    "gmm_heads_loop",
    "gmm_nll",
    "measure_training_step",
    "mlp_eager",
    "sample_tasks",
    "sdpa_attention",
    "train_loss_curve",
    "train_step",
]
