"""A compact pre-norm Transformer language model, written plainly (nanoGPT style), with swappable parts.

Token embedding, ``n_layers`` pre-norm blocks (RMSNorm -> causal multi-head self-attention with RoPE,
RMSNorm -> SwiGLU feed-forward, both residual), a final RMSNorm and an untied output projection to
the vocabulary (10 000 by default). The five sizes of the systems course's benchmark, a ``tiny``
one for CPU tests and ``small-128k`` (small with a 128 256-token vocabulary) are in
:data:`LM_SIZES`; :func:`param_count` is their closed-form size.

Five parts are swappable through :class:`LMComponents`, as the TransformerNP's are: attention
(``q, k, v`` of shape (B, H, T, D) -> (B, H, T, D), causal), RMSNorm (``x, weight, eps``), SwiGLU
(``gate, up`` -> ``silu(gate) * up``), RoPE (``q, k`` of shape (B, T, H, D) and the (T, D/2) cos/sin
tables, half rotation as in Llama / GPT-NeoX) and the loss (``logits (N, V), targets (N,)``); a
sixth, ``add_norm`` (``x, r, weight, eps`` -> ``(x + r, RMSNorm(x + r))``), is each residual add
with the norm after it, fused where a components set has one (else the add, then ``norm``); a
seventh, ``linear`` (``x, *weights`` -> ``(x @ w1ᵀ, ...)``), the linear layers that read one x
(``F.linear`` each; ours, ``tritonlab.ops.linears``, sums dx inside the GEMMs and, under autocast,
gives the float32 weights their gradients straight from the GEMM).
:func:`torch_components` gives PyTorch's (naive attention by default, or SDPA), :func:`our_components`
the library's Triton kernels: flash2's causal FlashAttention-2, and ``tritonlab.ops``' RMSNorm (and
``add_rms_norm``), SwiGLU, RoPE and cross-entropy::

    cfg = lm_config("small", context_length=512)
    model = TransformerLM(cfg, our_components())          # or torch_components("sdpa")
    loss = model.loss(tokens, targets)                    # tokens, targets (B, T) int64

The head is swappable too: with ``head="fused"`` (either components function) the loss is
``tritonlab.ops.fused_linear_cross_entropy`` of the final hidden states and the output layer's
weight, so the (B·T, V) logits are never materialised (:func:`fused_head_loss`); ``model(tokens)``
still returns logits.
"""

import functools
import math
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tritonlab._runtime import autocast_dtype

VOCAB_SIZE = 10_000


@dataclass(frozen=True)
class LMConfig:
    """One model: widths, depth, heads, and the longest context it takes (its RoPE tables' length)."""

    d_model: int
    d_ff: int
    n_layers: int
    n_heads: int
    context_length: int = 1024
    vocab_size: int = VOCAB_SIZE
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        for name in ("d_model", "d_ff", "n_layers", "n_heads", "context_length", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"n_heads: {self.n_heads} heads do not divide d_model = {self.d_model} "
                f"(the head dimension would be {self.d_model / self.n_heads:g})"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"n_heads: the head dimension d_model / n_heads = {self.head_dim} must be even for RoPE"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def label(self) -> str:
        return (
            f"d_model {self.d_model}, d_ff {self.d_ff}, {self.n_layers} layers, {self.n_heads} heads, "
            f"context <= {self.context_length}, vocab {self.vocab_size}"
        )


# (d_model, d_ff, n_layers, n_heads) of the course's table, a tiny model for the CPU, and one with a
# large vocabulary.
LM_SIZES: dict[str, LMConfig] = {
    "tiny": LMConfig(64, 256, 2, 4, context_length=64),
    "small": LMConfig(768, 3072, 12, 12),
    "medium": LMConfig(1024, 4096, 24, 16),
    "large": LMConfig(1280, 5120, 36, 20),
    "xl": LMConfig(1600, 6400, 48, 25),
    "2.7B": LMConfig(2560, 10240, 32, 32),
    # small with Llama 3's 128 256-token vocabulary: embedding and output layer hold 0.20 B of its
    # 0.31 B parameters, and the logits outweigh the other activations, as with today's tokenizers.
    "small-128k": LMConfig(768, 3072, 12, 12, vocab_size=128_256),
}


def lm_config(size: str, context_length: int | None = None) -> LMConfig:
    """The named size; ``context_length`` (at most the size's maximum) shortens its RoPE tables."""
    if size not in LM_SIZES:
        raise ValueError(f"size: unknown {size!r}; expected one of {', '.join(LM_SIZES)}")
    cfg = LM_SIZES[size]
    if context_length is None:
        return cfg
    if not isinstance(context_length, int) or context_length < 1:
        raise ValueError(f"context_length: must be a positive integer, got {context_length!r}")
    if context_length > cfg.context_length:
        raise ValueError(
            f"context_length: {context_length} is beyond the {size} model's maximum of {cfg.context_length}"
        )
    return replace(cfg, context_length=context_length)


def param_count(cfg: LMConfig) -> int:
    """Parameters, in closed form: embedding V·d; per layer Q, K, V, O (4·d²), SwiGLU's W1, W3, W2
    (3·d·d_ff) and two RMSNorm weights (2·d); the final RMSNorm (d); the untied output layer d·V."""
    d, V = cfg.d_model, cfg.vocab_size
    return V * d + cfg.n_layers * (4 * d * d + 3 * d * cfg.d_ff + 2 * d) + d + d * V


# --- the PyTorch components ------------------------------------------------------------------------


@contextmanager
def _range(name: str, cuda: bool):
    with torch.profiler.record_function(name):
        if cuda:
            torch.cuda.nvtx.range_push(name)
        try:
            yield
        finally:
            if cuda:
                torch.cuda.nvtx.range_pop()


def naive_causal_attention_ranged(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """:func:`naive_causal_attention` with its three steps (scores, softmax, weighted sum) inside named
    ranges, for Nsight Systems (NVTX, on a GPU) and torch.profiler: the "naive-ranges" component."""
    T, D = q.shape[-2], q.shape[-1]
    with _range("attention: scores", q.is_cuda):
        scores = q @ k.transpose(-2, -1) / math.sqrt(D)
    with _range("attention: softmax", q.is_cuda):
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    with _range("attention: weighted sum", q.is_cuda):
        return weights @ v


def naive_causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q kᵀ / sqrt(D) + causal mask) v, written out: the T x T scores are materialised.
    (:func:`naive_causal_attention_ranged` names its steps for a profiler.)"""
    T, D = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return weights @ v


def sdpa_causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """PyTorch's scaled_dot_product_attention, causal (it picks its fastest backend)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def rms_norm_eager(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x²) + eps) · weight, in float32, returned in x's dtype."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def swiglu_eager(gate: Tensor, up: Tensor) -> Tensor:
    return F.silu(gate) * up


def rope_eager(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Half rotation of q, k (B, T, H, D) by the angles of positions 0..T-1 (cos, sin: (>= T, D/2))."""
    T = q.shape[1]
    cos, sin = cos[:T, None, :], sin[:T, None, :]

    def rotate(x: Tensor) -> Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


def linear_eager(x: Tensor, *weights: Tensor) -> tuple[Tensor, ...]:
    return tuple(F.linear(x, w) for w in weights)


def cross_entropy_eager(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits, targets)


# --- the library's Triton components ---------------------------------------------------------------


def flash_causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """flash2's FlashAttention-2 (Triton), causal, on (B, H, T, D). A head dimension the kernels do
    not take (the 2.7B model's 80) is zero-padded to the next one they do (q pre-scaled so the
    softmax still divides by sqrt(D)); the padded output columns are dropped."""
    from tritonlab.attention import HEAD_DIMS, FlashAttentionTriton

    B, H, T, D = q.shape
    padded = next((d for d in HEAD_DIMS if d >= D), None)
    if padded is None:
        raise ValueError(f"q: head dimension {D} exceeds the largest the kernels take ({max(HEAD_DIMS)})")
    if padded != D:
        q = F.pad(q * math.sqrt(padded / D), (0, padded - D))
        k, v = F.pad(k, (0, padded - D)), F.pad(v, (0, padded - D))
    o = FlashAttentionTriton.apply(
        q.reshape(B * H, T, padded), k.reshape(B * H, T, padded), v.reshape(B * H, T, padded), True
    )
    return o.view(B, H, T, padded)[..., :D]


def _rms_norm_triton(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Under autocast the norm's output feeds only a matmul, which autocast would cast to its dtype:
    the kernel writes that dtype directly (bit for bit the same values), one cast kernel fewer a norm
    in the forward and one in the backward."""
    from tritonlab.ops import rms_norm

    return rms_norm(x, weight, eps, out_dtype=autocast_dtype(x))


def _add_rms_norm_triton(x: Tensor, r: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """``(x + r, RMSNorm(x + r))`` in one kernel each way (``tritonlab.ops.add_rms_norm``): the sum
    in x's dtype (the float32 residual stream under autocast, r the bf16 branch output), the norm
    in the autocast dtype under autocast, as :func:`_rms_norm_triton` writes it."""
    from tritonlab.ops import add_rms_norm

    return add_rms_norm(x, r, weight, eps, out_dtype=autocast_dtype(x))


def _swiglu_triton(gate: Tensor, up: Tensor) -> Tensor:
    from tritonlab.ops import swiglu

    return swiglu(gate, up)


def _rope_triton(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    from tritonlab.ops import rope

    return rope(q, k, cos, sin)


def _cross_entropy_triton(logits: Tensor, targets: Tensor) -> Tensor:
    from tritonlab.ops import cross_entropy

    return cross_entropy(logits, targets)


def _linears_triton(x: Tensor, *weights: Tensor, shadows=None) -> tuple[Tensor, ...]:
    """The layers reading one x as one autograd node (``tritonlab.ops.linears``): dx summed inside
    the GEMMs, and under autocast each weight's gradient out of the GEMM in float32, not a bf16
    result widened by a copy kernel. ``shadows`` (a ``tritonlab.optim.WeightShadows``): weights
    with a current copy in the autocast dtype are read from it instead of being cast."""
    from tritonlab.ops import linears

    return linears(x, weights, shadows)


def fused_head_loss(hidden: Tensor, weight: Tensor, targets: Tensor) -> Tensor:
    """The mean cross-entropy of ``hidden (N, d) @ weight (V, d)ᵀ`` against ``targets (N,)`` by
    ``tritonlab.ops.fused_linear_cross_entropy``: the logits exist one chunk of tokens at a time.

    That op does not follow autocast (its GEMMs run in its inputs' dtype), so under autocast both
    operands are cast to the autocast dtype here, as ``nn.Linear`` would have them: the matmuls run
    in bf16 like the logits path's, and the float32 weight receives its gradient through the cast.
    """
    from tritonlab.ops import fused_linear_cross_entropy

    dtype = autocast_dtype(hidden)
    if dtype is not None:
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    return fused_linear_cross_entropy(hidden, weight, targets)


LM_ATTENTIONS: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "naive": naive_causal_attention,
    "naive-ranges": naive_causal_attention_ranged,
    "sdpa": sdpa_causal_attention,
    "flash2": flash_causal_attention,
}


@dataclass
class LMComponents:
    """The swappable parts of :class:`TransformerLM`; the defaults are PyTorch's, naive attention."""

    attention: Callable[[Tensor, Tensor, Tensor], Tensor] = naive_causal_attention
    norm: Callable[[Tensor, Tensor, float], Tensor] = rms_norm_eager
    swiglu: Callable[[Tensor, Tensor], Tensor] = swiglu_eager
    rope: Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]] = rope_eager
    loss: Callable[[Tensor, Tensor], Tensor] = field(default=cross_entropy_eager)
    # (hidden (N, d), output weight (V, d), targets (N,)) -> mean loss; when set, the loss replaces
    # the output layer and ``loss`` together, and no full logits are made.
    head_loss: Callable[[Tensor, Tensor, Tensor], Tensor] | None = None
    # (x, r, weight, eps) -> (s, norm(s)) with s = x + r: a residual add and the norm after it, fused.
    # None (PyTorch's): ``s = x + r`` and then ``norm``, the same operations as unfused, so a set
    # whose ``norm`` is swapped (autoselect's dispatchers) norms every block through it. A set that
    # has one must keep it the same function of its ``norm`` (the norm of x + r, s in x's dtype).
    add_norm: Callable[[Tensor, Tensor, Tensor, float], tuple[Tensor, Tensor]] | None = None
    # (x, *weights) -> (x @ w1ᵀ, x @ w2ᵀ, ...): the linear layers that read one x (q, k and v; the
    # gate and up projections; alone: the output projections and the output layer).
    linear: Callable[..., tuple[Tensor, ...]] = field(default=linear_eager)


HEADS = ("logits", "fused")


def _head_loss(head: str):
    if head not in HEADS:
        raise ValueError(f"head: unknown {head!r}; expected one of {', '.join(HEADS)}")
    return fused_head_loss if head == "fused" else None


def torch_components(attention: str = "naive", head: str = "logits") -> LMComponents:
    """PyTorch's components, with ``attention`` one of "naive" and "sdpa" (or "flash2"); ``head``
    "fused" takes the loss through :func:`fused_head_loss` instead of logits + cross-entropy."""
    if attention not in LM_ATTENTIONS:
        raise ValueError(f"attention: unknown {attention!r}; expected one of {', '.join(LM_ATTENTIONS)}")
    return LMComponents(attention=LM_ATTENTIONS[attention], head_loss=_head_loss(head))


def our_components(head: str = "logits", shadows=None) -> LMComponents:
    """Every part on the library's Triton kernels: FlashAttention-2 (causal), RMSNorm (the residual
    adds fused into the norms after them), SwiGLU, RoPE, cross-entropy; the linear layers sharing an input as one node, dx summed in the
    GEMMs and dW out of them in float32 under autocast (``tritonlab.ops.linears``, cuBLAS);
    ``head`` "fused" fuses the output layer into the loss (:func:`fused_head_loss`). ``shadows`` (a
    ``tritonlab.optim.WeightShadows``, e.g. the one ``tritonlab.optim.AdamW(shadows=...)`` writes):
    the linear layers read each weight's current bf16 copy instead of casting it under autocast
    (the fused head's output weight is still cast). The components exist before the model, so add
    the weights once it does::

        shadows = WeightShadows()
        model = TransformerLM(cfg, our_components(shadows=shadows))
        shadows.add(p for p in model.parameters() if p.dim() == 2)
        optimizer = AdamW(model.parameters(), shadows=shadows)"""
    return LMComponents(
        attention=flash_causal_attention,
        norm=_rms_norm_triton,
        add_norm=_add_rms_norm_triton,
        swiglu=_swiglu_triton,
        rope=_rope_triton,
        loss=_cross_entropy_triton,
        head_loss=_head_loss(head),
        linear=_linears_triton if shadows is None else functools.partial(_linears_triton, shadows=shadows),
    )


# --- the model -------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """``norm(x)``; with a ``residual``, the pair ``(x + residual, norm(x + residual))`` -- the
    components' ``add_norm`` where they have one, else the add and then ``norm``."""

    def __init__(self, d_model: int, eps: float, components: LMComponents):
        super().__init__()
        self.eps, self.components = eps, components
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        if residual is None:
            return self.components.norm(x, self.weight, self.eps)
        if self.components.add_norm is not None:
            return self.components.add_norm(x, residual, self.weight, self.eps)
        s = x + residual
        return s, self.components.norm(s, self.weight, self.eps)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: LMConfig, components: LMComponents):
        super().__init__()
        self.cfg, self.components = cfg, components
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.output_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        B, T, _ = x.shape
        H, D = self.cfg.n_heads, self.cfg.head_dim
        linear = self.components.linear
        q, k, v = (
            t.view(B, T, H, D) for t in linear(x, self.q_proj.weight, self.k_proj.weight, self.v_proj.weight)
        )
        q, k = self.components.rope(q, k, cos, sin)  # positions 0..T-1, on (B, T, H, D)
        o = self.components.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        (out,) = linear(o.transpose(1, 2).reshape(B, T, H * D), self.output_proj.weight)
        return out


class SwiGLUFeedForward(nn.Module):
    def __init__(self, cfg: LMConfig, components: LMComponents):
        super().__init__()
        self.components = components
        self.w1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)  # gate
        self.w3 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)  # up
        self.w2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)  # down

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.components.linear(x, self.w1.weight, self.w3.weight)
        (out,) = self.components.linear(self.components.swiglu(gate, up), self.w2.weight)
        return out


class Block(nn.Module):
    """x + attention(RMSNorm(x)), then + feed-forward(RMSNorm(·)).

    Each residual add is made by the norm that follows it (``RMSNorm(x, r)``, the components'
    ``add_norm``), so a block takes the stream ``x`` with the previous block's feed-forward output
    ``r`` not yet added (None for the first block) and returns ``(x, r)`` the same way: its stream
    after the attention's add, and its feed-forward output, which the next block's ln1 (or the final
    norm) adds."""

    def __init__(self, cfg: LMConfig, components: LMComponents):
        super().__init__()
        self.ln1 = RMSNorm(cfg.d_model, cfg.norm_eps, components)
        self.attn = CausalSelfAttention(cfg, components)
        self.ln2 = RMSNorm(cfg.d_model, cfg.norm_eps, components)
        self.ffn = SwiGLUFeedForward(cfg, components)

    def forward(self, x: Tensor, r: Tensor | None, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        if r is None:
            h = self.ln1(x)
        else:
            x, h = self.ln1(x, r)
        x, h = self.ln2(x, self.attn(h, cos, sin))
        return x, self.ffn(h)


class TransformerLM(nn.Module):
    """``model(tokens)`` -> logits (B, T, V); ``model.loss(tokens, targets)`` -> the mean cross-entropy.

    The residual stream stays in the embedding's dtype (float32 under autocast: the blocks' bf16
    outputs are added to it); the RoPE tables are float32 buffers of ``cfg.context_length`` rows.
    """

    def __init__(self, cfg: LMConfig, components: LMComponents | None = None):
        super().__init__()
        self.cfg = cfg
        self.components = components or LMComponents()
        self.token_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg, self.components) for _ in range(cfg.n_layers))
        self.ln_final = RMSNorm(cfg.d_model, cfg.norm_eps, self.components)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        half = cfg.head_dim // 2
        inv_freq = cfg.rope_theta ** (-torch.arange(0, half, dtype=torch.float64) * 2 / cfg.head_dim)
        angles = torch.arange(cfg.context_length, dtype=torch.float64)[:, None] * inv_freq[None, :]
        self.register_buffer("rope_cos", angles.cos().float(), persistent=False)
        self.register_buffer("rope_sin", angles.sin().float(), persistent=False)

    def check_tokens(self, tokens: Tensor, name: str = "tokens") -> None:
        if not isinstance(tokens, Tensor) or tokens.dim() != 2:
            shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
            raise ValueError(f"{name}: expected a (batch, sequence) tensor of token ids, got {shape}")
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
            raise ValueError(f"{name}: expected integer token ids, got {tokens.dtype}")
        if tokens.shape[1] > self.cfg.context_length:
            raise ValueError(
                f"{name}: sequence length {tokens.shape[1]} is beyond the model's maximum context "
                f"of {self.cfg.context_length}"
            )

    def hidden(self, tokens: Tensor) -> Tensor:
        """The final RMSNorm's output (B, T, d_model): what the output layer multiplies."""
        self.check_tokens(tokens)
        x, r = self.token_embeddings(tokens), None
        for layer in self.layers:
            x, r = layer(x, r, self.rope_cos, self.rope_sin)  # r: the FFN output, added by the next norm
        _, h = self.ln_final(x, r)  # n_layers >= 1: there is always the last FFN's output to add
        return h

    def forward(self, tokens: Tensor) -> Tensor:
        (logits,) = self.components.linear(self.hidden(tokens), self.lm_head.weight)
        return logits

    def loss(self, tokens: Tensor, targets: Tensor) -> Tensor:
        self.check_tokens(targets, "targets")
        if targets.shape != tokens.shape:
            raise ValueError(
                f"targets: shape {tuple(targets.shape)} must match tokens' {tuple(tokens.shape)}"
            )
        if self.components.head_loss is not None:
            h = self.hidden(tokens)
            return self.components.head_loss(
                h.reshape(-1, h.shape[-1]), self.lm_head.weight, targets.reshape(-1)
            )
        logits = self(tokens)
        return self.components.loss(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def random_batch(
    cfg: LMConfig, batch_size: int, context: int, device=None, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Random token ids and next-token targets, (batch_size, context) each, as the benchmark feeds."""
    if context > cfg.context_length:
        raise ValueError(f"context: {context} is beyond the model's maximum of {cfg.context_length}")
    ids = torch.randint(0, cfg.vocab_size, (batch_size, context + 1), generator=generator).to(device)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


__all__ = [
    "HEADS",
    "LM_ATTENTIONS",
    "LM_SIZES",
    "VOCAB_SIZE",
    "LMComponents",
    "LMConfig",
    "TransformerLM",
    "cross_entropy_eager",
    "flash_causal_attention",
    "fused_head_loss",
    "lm_config",
    "naive_causal_attention",
    "naive_causal_attention_ranged",
    "our_components",
    "param_count",
    "random_batch",
    "rms_norm_eager",
    "rope_eager",
    "sdpa_causal_attention",
    "swiglu_eager",
    "torch_components",
]
