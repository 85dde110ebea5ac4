"""The Transformer Neural Process (TNP) of the spec, with its four swappable components.

Every context point (x, y) and target point (x) becomes one token. All M+N tokens attend to
the M context tokens only -- a rectangular attention, (M+N) queries over M keys -- and a
mixture-of-Gaussians head predicts y at each target. Later phases replace the attention,
MLP, heads or loss with Triton kernels by passing their own :class:`Components`.

Activation checkpointing (``TransformerNP(cfg, components, checkpoint=...)``, see
:data:`CHECKPOINT_MODES`) trades recomputation in the backward for the activations a block would
otherwise keep; it works with any components, since it only decides which of the block's calls
run under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint as _checkpoint

# --- the four components, as plain functions --------------------------------------------------


def mlp_eager(x: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    """silu(x W1ᵀ) W2ᵀ, weights in nn.Linear layout: w1 (d_ff, d_model), w2 (d_model, d_ff)."""
    return F.linear(F.silu(F.linear(x, w1)), w2)


def gmm_heads_loop(z: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    """The spec's K head MLPs, one after another: z (T, d) -> (T, K, 3).

    w1 (K, d_head, d_model), w2 (K, 3, d_head). Phase 07 replaces this Python loop by one
    grouped kernel.
    """
    return torch.stack([mlp_eager(z, w1[k], w2[k]) for k in range(w1.shape[0])], dim=1)


LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def gmm_nll(params: Tensor, y: Tensor) -> Tensor:
    """Mean negative log-likelihood of y under the per-target Gaussian mixtures.

    params (T, K, 3) holds (logit_weight, mu, log_sigma) per component; y is (T,) or (T, 1).
    log p(y) = logsumexp_k [log_softmax(logit)_k + log N(y; mu_k, exp(log_sigma_k))], computed in
    float32 with the stable logsumexp, since bf16 logits would lose the tails.
    """
    logit_w, mu, log_sigma = params.float().unbind(-1)
    y = y.float().reshape(-1, 1)
    z = (y - mu) * torch.exp(-log_sigma)
    log_normal = -0.5 * z * z - log_sigma - LOG_SQRT_2PI
    return -torch.logsumexp(F.log_softmax(logit_w, dim=-1) + log_normal, dim=-1).mean()


SDPA_BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


def sdpa_attention(backend: str) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """Rectangular attention through PyTorch SDPA, pinned to one backend.

    q (B, H, M+N, D) attends to k, v (B, H, M, D): the context keys only, so no mask is needed.
    Only the named backend is allowed, so if it cannot run these inputs SDPA raises instead of
    silently falling back to the slow math kernel.
    """
    if backend not in SDPA_BACKENDS:
        raise ValueError(f"sdpa backend: unknown {backend!r}; expected one of {', '.join(SDPA_BACKENDS)}")

    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        with sdpa_kernel(SDPA_BACKENDS[backend]):
            return F.scaled_dot_product_attention(q, k, v)

    attend.__name__ = f"sdpa_{backend}"
    return attend


@dataclass
class Components:
    """The swappable parts of the model; each later phase passes its kernels here."""

    attention: Callable[[Tensor, Tensor, Tensor], Tensor] = field(
        default_factory=lambda: sdpa_attention("math")
    )
    mlp: Callable[[Tensor, Tensor, Tensor], Tensor] = mlp_eager
    heads: Callable[[Tensor, Tensor, Tensor], Tensor] = gmm_heads_loop
    loss: Callable[[Tensor, Tensor], Tensor] = gmm_nll
    # The same attention over K and V packed as W_KV projects them, (B, M, 2, H, D), if there is one
    # (``tritonlab.attention.fused_attention_kv``): the attention block then calls it instead, and
    # the gradient reaches W_KV with no copy interleaving dK and dV. (Checkpoint mode "selective"
    # recomputes K and V apart and keeps calling ``attention``.)
    attention_kv: Callable[[Tensor, Tensor], Tensor] | None = None


@dataclass(frozen=True)
class TNPConfig:
    n_layers: int = 12
    n_heads: int = 8
    head_dim: int = 64
    d_ff: int = 1365
    n_components: int = 10
    d_head_hidden: int = 1365
    x_dim: int = 1
    y_dim: int = 1
    norm_eps: float = 1e-6

    @property
    def d_model(self) -> int:
        return self.n_heads * self.head_dim


# --- activation checkpointing -----------------------------------------------------------------

CHECKPOINT_MODES: dict[str, str] = {
    "none": "no recomputation: every block keeps its activations for the backward",
    "block": "the whole block is recomputed in the backward; it keeps only its input",
    "selective": "everything but the attention call is recomputed (norms, Q/K/V and output "
    "projections, MLP); the attention's inputs, output and saved statistics are kept, so the "
    "backward never reruns the attention",
    "mlp": "only the MLP half (RMSNorm, W1, SiLU, W2) is recomputed; the attention half keeps "
    "its activations",
}


def check_checkpoint(mode: str) -> str:
    """``mode`` if it is one of :data:`CHECKPOINT_MODES`, else a ValueError naming the argument."""
    if mode not in CHECKPOINT_MODES:
        raise ValueError(f"checkpoint: unknown mode {mode!r}; expected one of {', '.join(CHECKPOINT_MODES)}")
    return mode


def _recomputed(fn, *args):
    # Non-reentrant: gradients flow to parameters and to inputs that need none alike, autocast is
    # replayed, and nested autograd functions (our kernels) save and restore their tensors as usual.
    return _checkpoint(fn, *args, use_reentrant=False)


# --- the model --------------------------------------------------------------------------------


class RectangularAttention(nn.Module):
    def __init__(self, cfg: TNPConfig, components: Components):
        super().__init__()
        self.cfg, self.components = cfg, components
        self.wq = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wkv = nn.Linear(cfg.d_model, 2 * cfg.d_model, bias=False)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, h: Tensor, m_context: int) -> Tensor:
        if self.components.attention_kv is not None:
            return self.project_out(self.components.attention_kv(*self.project_packed(h, m_context)))
        return self.project_out(self.components.attention(*self.project_in(h, m_context)))

    def project_packed(self, h: Tensor, m_context: int) -> tuple[Tensor, Tensor]:
        """q (B, H, M+N, D) from every token, K and V packed (B, M, 2, H, D) from the context tokens."""
        B, L, _ = h.shape
        H, D = self.cfg.n_heads, self.cfg.head_dim
        q = self.wq(h).view(B, L, H, D).transpose(1, 2)
        # Keys and values of the context tokens only: the same as projecting every token and
        # slicing K, V to [:, :, :M], without computing the N rows nobody reads.
        return q, self.wkv(h[:, :m_context]).view(B, m_context, 2, H, D)

    def project_in(self, h: Tensor, m_context: int) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, H, M+N, D) from every token, k and v (B, H, M, D) from the context tokens."""
        q, kv = self.project_packed(h, m_context)
        return q, kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)

    def project_out(self, o: Tensor) -> Tensor:
        """The attention output o (B, H, M+N, D) back to (B, M+N, d_model) through W_O."""
        B, H, L, D = o.shape
        return self.wo(o.transpose(1, 2).reshape(B, L, H * D))


class Block(nn.Module):
    """Pre-norm transformer block: RMSNorm -> attention, RMSNorm -> MLP, both residual."""

    def __init__(self, cfg: TNPConfig, components: Components):
        super().__init__()
        self.components = components
        self.attn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = RectangularAttention(cfg, components)
        self.mlp_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.w1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, h: Tensor, m_context: int, checkpoint: str = "none") -> Tensor:
        """The block; ``checkpoint`` (one of :data:`CHECKPOINT_MODES`) picks what the backward
        recomputes instead of keeping. Every mode computes the same operations in the same order,
        so the loss and the gradients are those of ``"none"``."""
        if check_checkpoint(checkpoint) == "none" or not torch.is_grad_enabled():
            return self._whole(h, m_context)
        if checkpoint == "block":
            return _recomputed(self._whole, h, m_context)
        if checkpoint == "mlp":
            return _recomputed(self._mlp_half, self._attention_half(h, m_context))
        # "selective": the attention call alone runs outside the recomputed regions, so autograd
        # keeps what it saves (its q, k, v, output and statistics) and its backward reads them.
        q, k, v = _recomputed(self._qkv, h, m_context)
        return _recomputed(self._after_attention, h, self.components.attention(q, k, v))

    def _whole(self, h: Tensor, m_context: int) -> Tensor:
        return self._mlp_half(self._attention_half(h, m_context))

    def _attention_half(self, h: Tensor, m_context: int) -> Tensor:
        return h + self.attn(self.attn_norm(h), m_context)

    def _mlp_half(self, h: Tensor) -> Tensor:
        return h + self.components.mlp(self.mlp_norm(h), self.w1.weight, self.w2.weight)

    def _qkv(self, h: Tensor, m_context: int) -> tuple[Tensor, Tensor, Tensor]:
        return self.attn.project_in(self.attn_norm(h), m_context)

    def _after_attention(self, h: Tensor, o: Tensor) -> Tensor:
        return self._mlp_half(h + self.attn.project_out(o))


class TransformerNP(nn.Module):
    """``checkpoint``: which activations of each transformer block the backward recomputes instead
    of keeping, one of :data:`CHECKPOINT_MODES` ("none", the default, recomputes nothing). It can be
    changed on a built model (``model.checkpoint = "block"``); it leaves weights and results alone."""

    def __init__(
        self, cfg: TNPConfig = TNPConfig(), components: Components | None = None, checkpoint: str = "none"
    ):
        super().__init__()
        if cfg.y_dim != 1:
            raise ValueError(
                f"y_dim: the GMM head models a scalar target, so y_dim must be 1, got {cfg.y_dim}"
            )
        self.checkpoint = checkpoint
        self.cfg = cfg
        self.components = components or Components()
        self.embed = nn.Linear(cfg.x_dim + cfg.y_dim + 1, cfg.d_model, bias=False)
        self.blocks = nn.ModuleList(Block(cfg, self.components) for _ in range(cfg.n_layers))
        self.final_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        K, d_hidden = cfg.n_components, cfg.d_head_hidden
        # K head MLPs (d_model -> d_hidden -> 3), stacked so a grouped kernel can take them whole.
        self.head_w1 = nn.Parameter(torch.empty(K, d_hidden, cfg.d_model))
        self.head_w2 = nn.Parameter(torch.empty(K, 3, d_hidden))
        for k in range(K):
            nn.init.kaiming_uniform_(self.head_w1[k], a=math.sqrt(5))
            nn.init.kaiming_uniform_(self.head_w2[k], a=math.sqrt(5))

    @property
    def checkpoint(self) -> str:
        return self._checkpoint

    @checkpoint.setter
    def checkpoint(self, mode: str) -> None:
        self._checkpoint = check_checkpoint(mode)

    def tokens(self, xc: Tensor, yc: Tensor, xt: Tensor) -> Tensor:
        """[x, y, is_target] per point; a target's y is zero, since it is what we predict."""
        B, N, _ = xt.shape
        context = torch.cat([xc, yc, xc.new_zeros(B, xc.shape[1], 1)], dim=-1)
        target = torch.cat([xt, xt.new_zeros(B, N, self.cfg.y_dim), xt.new_ones(B, N, 1)], dim=-1)
        return torch.cat([context, target], dim=1)

    def forward(self, xc: Tensor, yc: Tensor, xt: Tensor) -> Tensor:
        """Mixture parameters (B·N, K, 3) for the N targets of each of the B tasks."""
        m_context = xc.shape[1]
        h = self.embed(self.tokens(xc, yc, xt))
        for block in self.blocks:
            h = block(h, m_context, self.checkpoint)
        # Only the target tokens feed the head: the loss reads nothing else.
        z = self.final_norm(h[:, m_context:]).reshape(-1, self.cfg.d_model)
        return self.components.heads(z, self.head_w1, self.head_w2)

    def loss(self, xc: Tensor, yc: Tensor, xt: Tensor, yt: Tensor) -> Tensor:
        return self.components.loss(self(xc, yc, xt), yt.reshape(-1))
