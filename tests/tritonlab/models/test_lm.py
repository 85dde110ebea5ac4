"""The Transformer LM of phase lm_bench: closed-form parameter counts of the five sizes, output
shapes, our Triton components against PyTorch's (same loss and gradients, fp32, tiny model), and bad
input as a ValueError naming the argument."""

import pytest
import torch

from tritonlab.models import (
    LM_SIZES,
    LMComponents,
    LMConfig,
    TransformerLM,
    lm_config,
    our_components,
    param_count,
    random_batch,
    torch_components,
)
from tritonlab.models.lm import flash_causal_attention, naive_causal_attention, rope_eager
from tritonlab.testing import rel_err

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
COURSE_SIZES = {  # (d_model, d_ff, layers, heads)
    "small": (768, 3072, 12, 12),
    "medium": (1024, 4096, 24, 16),
    "large": (1280, 5120, 36, 20),
    "xl": (1600, 6400, 48, 25),
    "2.7B": (2560, 10240, 32, 32),
}


@pytest.mark.parametrize("size", [*COURSE_SIZES, "tiny", "small-128k"])
def test_param_count_is_the_built_models(size):
    cfg = LM_SIZES[size]
    if size in COURSE_SIZES:
        assert (cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.n_heads) == COURSE_SIZES[size]
        assert cfg.vocab_size == 10_000
    with torch.device("meta"):
        model = TransformerLM(cfg)
    assert sum(p.numel() for p in model.parameters()) == param_count(cfg)
    d, f, n_layers, V = cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.vocab_size
    assert param_count(cfg) == 2 * V * d + n_layers * (4 * d * d + 3 * d * f + 2 * d) + d


def test_small_has_the_expected_size():
    assert param_count(LM_SIZES["small"]) == 128_625_408


def test_forward_shapes_and_loss():
    cfg = lm_config("tiny", 32)
    model = TransformerLM(cfg).to(DEVICE)
    tokens, targets = random_batch(cfg, 3, 17, device=DEVICE)
    logits = model(tokens)
    assert logits.shape == (3, 17, cfg.vocab_size)
    loss = model.loss(tokens, targets)
    assert loss.shape == () and torch.isfinite(loss)
    assert abs(loss.item() - torch.log(torch.tensor(cfg.vocab_size)).item()) < 1.5  # near-uniform at init


def _loss_and_grads(components: LMComponents, tokens, targets, cfg):
    torch.manual_seed(0)
    model = TransformerLM(cfg, components).to(DEVICE)
    loss = model.loss(tokens, targets)
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


def test_our_components_match_pytorchs_in_fp32():
    cfg = lm_config("tiny", 32)
    tokens, targets = random_batch(cfg, 2, 24, device=DEVICE, generator=torch.Generator().manual_seed(1))
    ref_loss, ref_grads = _loss_and_grads(torch_components("naive"), tokens, targets, cfg)
    sdpa_loss, _ = _loss_and_grads(torch_components("sdpa"), tokens, targets, cfg)
    our_loss, our_grads = _loss_and_grads(our_components(), tokens, targets, cfg)
    assert rel_err(sdpa_loss, ref_loss) < 1e-5
    assert rel_err(our_loss, ref_loss) < 1e-5
    for got, ref in zip(our_grads, ref_grads, strict=True):
        assert rel_err(got, ref) < 1e-4


@pytest.mark.parametrize("components", [torch_components, our_components], ids=["torch", "ours"])
def test_fused_head_gives_the_logits_heads_loss_and_gradients(components):
    cfg = lm_config("tiny", 32)
    tokens, targets = random_batch(cfg, 2, 19, device=DEVICE, generator=torch.Generator().manual_seed(2))
    ref_loss, ref_grads = _loss_and_grads(components(), tokens, targets, cfg)
    loss, grads = _loss_and_grads(components(head="fused"), tokens, targets, cfg)
    assert loss.dtype == ref_loss.dtype and rel_err(loss, ref_loss) < 1e-5
    for got, ref in zip(grads, ref_grads, strict=True):
        assert rel_err(got, ref) < 1e-4


def test_fused_head_follows_autocast():
    """Under autocast the fused head multiplies in the autocast dtype, as the output layer would, and
    the float32 weight still gets a float32 gradient."""
    from tritonlab.models import fused_head_loss

    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(13, 16, generator=g).to(DEVICE)
    weight = torch.randn(37, 16, generator=g).to(DEVICE).requires_grad_()
    targets = torch.randint(0, 37, (13,), generator=g).to(DEVICE)
    dtype = torch.bfloat16 if DEVICE.type == "cuda" else torch.float16
    with torch.autocast(DEVICE.type, dtype=dtype):
        loss = fused_head_loss(hidden, weight, targets)
    ref = torch.nn.functional.cross_entropy((hidden.to(dtype) @ weight.to(dtype).T).double(), targets)
    assert loss.dtype == torch.float32 and rel_err(loss, ref) < 1e-2
    loss.backward()
    assert weight.grad.dtype == torch.float32 and torch.isfinite(weight.grad).all()


def test_our_norm_writes_the_autocast_dtype_that_the_next_matmul_takes():
    """Under autocast our RMSNorm returns the autocast dtype, the same values the eager norm's float32
    output cast by autocast would give, and float32 gradients for the float32 residual and weight."""
    norm = our_components().norm
    dtype = torch.bfloat16 if DEVICE.type == "cuda" else torch.float16
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 5, 48, generator=g).to(DEVICE).requires_grad_()
    w = torch.randn(48, generator=g).to(DEVICE).requires_grad_()
    with torch.autocast(DEVICE.type, dtype=dtype):
        y = norm(x, w, 1e-5)
        want = torch_components().norm(x, w, 1e-5)
    assert y.dtype == dtype and want.dtype == torch.float32
    assert rel_err(y, want) < 4e-3
    dx, dw = torch.autograd.grad(y, (x, w), torch.ones_like(y))
    assert dx.dtype == dw.dtype == torch.float32
    assert norm(x, w, 1e-5).dtype == torch.float32  # no autocast: x's dtype


def test_our_add_norm_is_the_add_then_the_norm_in_the_autocast_dtype():
    """Ours fuses the add into the norm: the same s (x's dtype, float32) and the norm of it written in
    the autocast dtype, as PyTorch's add then norm (cast by autocast) give; gradients in each input's
    dtype, the branch output's in its own half precision."""
    add_norm = our_components().add_norm
    dtype = torch.bfloat16 if DEVICE.type == "cuda" else torch.float16
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 5, 48, generator=g).to(DEVICE).requires_grad_()
    r = torch.randn(3, 5, 48, generator=g).to(DEVICE).to(dtype).requires_grad_()
    w = torch.randn(48, generator=g).to(DEVICE).requires_grad_()
    with torch.autocast(DEVICE.type, dtype=dtype):
        s, y = add_norm(x, r, w, 1e-5)
        want_s = x + r
        want_y = torch_components().norm(want_s, w, 1e-5)
    assert s.dtype == torch.float32 and y.dtype == dtype and torch.equal(s, want_s)
    assert rel_err(y, want_y) < 4e-3
    dx, dr, dw = torch.autograd.grad((s, y), (x, r, w), (torch.ones_like(s), torch.ones_like(y)))
    assert dx.dtype == dw.dtype == torch.float32 and dr.dtype == dtype
    s, y = add_norm(x, r.float(), w, 1e-5)  # no autocast: x's dtype
    assert s.dtype == y.dtype == torch.float32


def _old_hidden(model: TransformerLM, tokens):
    """The forward before the adds moved into the norms, written out: x + attn(ln1(x)), then
    + ffn(ln2(x)), each norm on its own."""
    c = model.components
    x = model.token_embeddings(tokens)
    for layer in model.layers:
        x = x + layer.attn(c.norm(x, layer.ln1.weight, layer.ln1.eps), model.rope_cos, model.rope_sin)
        x = x + layer.ffn(c.norm(x, layer.ln2.weight, layer.ln2.eps))
    return c.norm(x, model.ln_final.weight, model.ln_final.eps)


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_pytorchs_components_compute_what_they_did_before_the_fused_adds(attention):
    """PyTorch's components run the same operations in the same order as the unfused forward: loss
    and every gradient bit for bit (the baselines are unchanged)."""
    cfg = lm_config("tiny", 32)
    tokens, targets = random_batch(cfg, 2, 24, device=DEVICE, generator=torch.Generator().manual_seed(6))
    torch.manual_seed(0)
    model = TransformerLM(cfg, torch_components(attention)).to(DEVICE)
    results = []
    for hidden in (model.hidden, lambda t: _old_hidden(model, t)):
        model.zero_grad(set_to_none=True)
        logits = model.lm_head(hidden(tokens))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets.reshape(-1))
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (new_loss, new_grads), (old_loss, old_grads) = results
    assert torch.equal(new_loss, old_loss) and torch.equal(model.loss(tokens, targets).detach(), old_loss)
    for got, want in zip(new_grads, old_grads, strict=True):
        assert torch.equal(got, want)


def test_parameter_names_are_unchanged():
    model = TransformerLM(lm_config("tiny", 16), our_components())
    per_layer = ["ln1.weight", "attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight",
                 "attn.output_proj.weight", "ln2.weight", "ffn.w1.weight", "ffn.w3.weight", "ffn.w2.weight"]  # fmt: skip
    assert list(model.state_dict()) == [
        "token_embeddings.weight",
        *(f"layers.{i}.{name}" for i in range(2) for name in per_layer),
        "ln_final.weight",
        "lm_head.weight",
    ]


@pytest.mark.parametrize("variant", ["ours", "mixed"])
def test_every_residual_add_goes_through_the_fused_add_norm(variant):
    """Ours (and ours with SDPA attention, lm_bench's "mixed"): the first block's ln1 is a plain norm
    (nothing to add yet); each other norm -- ln1 after the previous block's FFN, ln2 after the
    attention, the final norm after the last FFN -- adds its residual itself."""
    from dataclasses import replace

    from tritonlab.models import LM_ATTENTIONS

    base = our_components()
    if variant == "mixed":
        base = replace(base, attention=LM_ATTENTIONS["sdpa"])
    calls = {"norm": 0, "add_norm": 0}

    def counted(name, fn):
        def call(*args):
            calls[name] += 1
            return fn(*args)

        return call

    components = replace(base, norm=counted("norm", base.norm), add_norm=counted("add_norm", base.add_norm))
    cfg = lm_config("tiny", 16)
    model = TransformerLM(cfg, components).to(DEVICE)
    tokens, targets = random_batch(cfg, 1, 8, device=DEVICE, generator=torch.Generator().manual_seed(7))
    model.loss(tokens, targets).backward()
    assert calls == {"norm": 1, "add_norm": 2 * cfg.n_layers}


def test_our_components_match_pytorchs_under_autocast():
    """The mixed-dtype path: a float32 residual stream, half-precision branch outputs and norms;
    the tolerances of lm_bench's bf16 check (loss 2e-2, gradients 6e-2)."""
    cfg = lm_config("tiny", 32)
    tokens, targets = random_batch(cfg, 2, 32, device=DEVICE, generator=torch.Generator().manual_seed(8))
    dtype = torch.bfloat16 if DEVICE.type == "cuda" else torch.float16
    results = []
    for components in (torch_components("naive"), our_components()):
        torch.manual_seed(0)
        model = TransformerLM(cfg, components).to(DEVICE)
        with torch.autocast(DEVICE.type, dtype=dtype):
            loss = model.loss(tokens, targets)
        loss.backward()
        results.append((loss.detach().float(), [p.grad.float() for p in model.parameters()]))
    (ref_loss, ref_grads), (loss, grads) = results
    assert rel_err(loss, ref_loss) < 2e-2
    for (name, _), got, ref in zip(TransformerLM(cfg).named_parameters(), grads, ref_grads, strict=True):
        assert rel_err(got, ref) < 6e-2, name


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_pytorchs_components_compile_without_graph_breaks(attention):
    cfg = lm_config("tiny", 16)
    model = TransformerLM(cfg, torch_components(attention)).to(DEVICE)
    tokens, targets = random_batch(cfg, 2, 16, device=DEVICE)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model.loss)(tokens, targets)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons


def test_flash_attention_pads_a_head_dim_the_kernels_do_not_take():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 20, 10, generator=g).to(DEVICE).requires_grad_() for _ in range(3))
    out = flash_causal_attention(q, k, v)
    ref = naive_causal_attention(q, k, v)
    assert out.shape == ref.shape and rel_err(out, ref) < 1e-5
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
    for got, want in zip(grads, ref_grads, strict=True):
        assert rel_err(got, want) < 1e-4


def test_rope_eager_matches_the_kernel():
    from tritonlab.ops import rope

    model = TransformerLM(lm_config("tiny", 16))
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 16, 4, 16, generator=g), torch.randn(2, 16, 4, 16, generator=g)
    cos, sin = model.rope_cos.to(DEVICE), model.rope_sin.to(DEVICE)
    for got, want in zip(
        rope(q.to(DEVICE), k.to(DEVICE), cos, sin),
        rope_eager(q.to(DEVICE), k.to(DEVICE), cos, sin),
        strict=True,
    ):
        assert rel_err(got, want) < 1e-6


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: lm_config("huge"), "size"),
        (lambda: lm_config("small", 4096), "context_length"),
        (lambda: lm_config("tiny", 0), "context_length"),
        (lambda: LMConfig(d_model=100, d_ff=400, n_layers=2, n_heads=3), "n_heads"),
        (lambda: LMConfig(d_model=64, d_ff=0, n_layers=2, n_heads=4), "d_ff"),
        (lambda: torch_components("flash3"), "attention"),
        (lambda: our_components(head="chunked"), "head"),
    ],
)
def test_bad_configuration_names_the_argument(make, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        make()


def test_bad_tokens_name_the_argument():
    cfg = lm_config("tiny", 16)
    model = TransformerLM(cfg)
    with pytest.raises(ValueError, match="^tokens: sequence length 17 is beyond"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="^tokens: expected integer"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="^tokens: expected a"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="^targets: shape"):
        model.loss(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="^context:"):
        random_batch(cfg, 1, 17)


def test_attention_ranges_change_nothing_and_show_in_the_profiler():
    from tritonlab.models.lm import naive_causal_attention_ranged

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 8, device=DEVICE) for _ in range(3))
    plain = naive_causal_attention(q, k, v)
    with torch.profiler.profile() as prof:
        ranged = naive_causal_attention_ranged(q, k, v)
    assert torch.equal(plain, ranged)
    names = {e.key for e in prof.key_averages()}
    assert {"attention: scores", "attention: softmax", "attention: weighted sum"} <= names
    with torch.profiler.profile() as prof:
        naive_causal_attention(q, k, v)
    assert not any(e.key.startswith("attention:") for e in prof.key_averages())


@pytest.mark.gpu
def test_our_components_match_pytorchs_under_bf16_autocast_on_a_gpu():
    """The fused add + norm in the model's real setting: bf16 autocast, head dimension 64 (flash2's),
    our components against PyTorch's naive ones within lm_bench's bf16 check (2e-2, 6e-2)."""
    cfg = LMConfig(256, 1024, 4, 4, context_length=256)
    tokens, targets = random_batch(cfg, 4, 256, device="cuda", generator=torch.Generator().manual_seed(9))
    results = []
    for components in (torch_components("naive"), our_components(), our_components(head="fused")):
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = TransformerLM(cfg, components)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model.loss(tokens, targets)
        loss.backward()
        results.append((loss.detach().float(), [p.grad.float() for p in model.parameters()]))
    (ref_loss, ref_grads), *ours = results
    for loss, grads in ours:
        assert rel_err(loss, ref_loss) < 2e-2
        for got, ref in zip(grads, ref_grads, strict=True):
            assert rel_err(got, ref) < 6e-2


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ["torch", "tritonlab+shadows"])
def test_a_graphed_train_step_on_our_kernels_matches_the_plain_step(optimizer):
    # Every kernel of ours in one CUDA graph with AdamW: the cross-entropy's target check becomes a
    # device-side assertion there, the rest launches capture-safely after the warm-up. With
    # tritonlab's AdamW the linear layers read the bf16 weight copies it writes.
    from tritonlab.graphs import GraphedStep
    from tritonlab.optim import AdamW, WeightShadows

    cfg = lm_config("tiny", 64)
    tokens, targets = random_batch(cfg, 2, 64, device="cuda", generator=torch.Generator().manual_seed(3))

    def build():
        torch.manual_seed(0)
        shadows = WeightShadows() if optimizer != "torch" else None
        with torch.device("cuda"):
            model = TransformerLM(cfg, our_components(shadows=shadows))
        if shadows is None:
            return model, torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True), None
        shadows.add(p for p in model.parameters() if p.dim() == 2)
        return model, AdamW(model.parameters(), lr=1e-3, shadows=shadows), shadows

    model, opt, _ = build()
    plain = []
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            loss = model.loss(tokens, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        plain.append(loss.detach().float())
    graphed_model, graphed_optimizer, shadows = build()
    step = GraphedStep(graphed_model, graphed_optimizer, graphed_model.loss, (tokens, targets), warmup=2,
                       autocast_dtype=torch.bfloat16)  # fmt: skip
    graphed = [step.step(tokens, targets).float().clone() for _ in range(3)]
    # flash2's backward adds dQ with atomics: not bitwise, within bf16 rounding of the update.
    assert rel_err(torch.stack(graphed), torch.stack(plain)) < 1e-2, (graphed, plain)
    for p, q in zip(graphed_model.parameters(), model.parameters(), strict=True):
        assert rel_err(p.detach(), q.detach()) < 1e-2
    for p in shadows.params() if shadows is not None else ():  # current, the cast of the trained weights
        assert torch.equal(shadows.get(p, torch.bfloat16), p.detach().to(torch.bfloat16))
