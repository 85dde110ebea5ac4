"""The models the kernels are measured in.

The Transformer Neural Process (TNP) of the lab's spec: 12 pre-norm blocks of rectangular attention
(M+N queries over the M context keys) and an MLP, then a mixture-of-Gaussians head of K MLPs and
its negative log-likelihood. Its four components -- attention, MLP, heads, loss -- are swappable
(:class:`Components`), so the library's kernels plug in where PyTorch's ran. Each block can be
activation-checkpointed with any components: ``TransformerNP(cfg, components, checkpoint="block")``
(or ``"selective"``, ``"mlp"``; :data:`CHECKPOINT_MODES` says what each recomputes).
"""

from .data import Tasks, sample_tasks
from .shapes import SHAPES, TNPShape, resolve_shape
from .tnp import (
    CHECKPOINT_MODES,
    SDPA_BACKENDS,
    Components,
    TNPConfig,
    TransformerNP,
    check_checkpoint,
    gmm_heads_loop,
    gmm_nll,
    mlp_eager,
    sdpa_attention,
)
from .training import DTYPES, autocast, build, check_dtype, train_loss_curve, train_step

__all__ = [
    "CHECKPOINT_MODES",
    "DTYPES",
    "SDPA_BACKENDS",
    "SHAPES",
    "Components",
    "TNPConfig",
    "TNPShape",
    "Tasks",
    "TransformerNP",
    "autocast",
    "build",
    "check_checkpoint",
    "check_dtype",
    "gmm_heads_loop",
    "gmm_nll",
    "mlp_eager",
    "resolve_shape",
    "sample_tasks",
    "sdpa_attention",
    "train_loss_curve",
    "train_step",
]
