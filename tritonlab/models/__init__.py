"""The models the kernels are measured in.

The Transformer Neural Process (TNP) of the lab's spec: 12 pre-norm blocks of rectangular attention
(M+N queries over the M context keys) and an MLP, then a mixture-of-Gaussians head of K MLPs and
its negative log-likelihood. Its four components -- attention, MLP, heads, loss -- are swappable
(:class:`Components`), so the library's kernels plug in where PyTorch's ran. Each block can be
activation-checkpointed with any components: ``TransformerNP(cfg, components, checkpoint="block")``
(or ``"selective"``, ``"mlp"``; :data:`CHECKPOINT_MODES` says what each recomputes).

The Transformer language model of phase lm_bench (:mod:`.lm`): ``TransformerLM(lm_config("small"),
our_components())``, five sizes and a tiny one in :data:`LM_SIZES`, PyTorch or Triton components.
"""

from .data import Tasks, sample_tasks
from .lm import (
    HEADS,
    LM_ATTENTIONS,
    LM_SIZES,
    LMComponents,
    LMConfig,
    TransformerLM,
    fused_head_loss,
    lm_config,
    our_components,
    param_count,
    random_batch,
    torch_components,
)
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
    "HEADS",
    "LM_ATTENTIONS",
    "LM_SIZES",
    "SDPA_BACKENDS",
    "SHAPES",
    "Components",
    "LMComponents",
    "LMConfig",
    "TNPConfig",
    "TNPShape",
    "Tasks",
    "TransformerLM",
    "TransformerNP",
    "autocast",
    "build",
    "check_checkpoint",
    "check_dtype",
    "fused_head_loss",
    "gmm_heads_loop",
    "gmm_nll",
    "lm_config",
    "mlp_eager",
    "our_components",
    "param_count",
    "random_batch",
    "resolve_shape",
    "sample_tasks",
    "sdpa_attention",
    "torch_components",
    "train_loss_curve",
    "train_step",
]
