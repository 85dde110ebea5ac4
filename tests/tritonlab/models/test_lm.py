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


@pytest.mark.parametrize("size", [*COURSE_SIZES, "tiny"])
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
def test_a_graphed_train_step_on_our_kernels_matches_the_plain_step():
    # Every kernel of ours in one CUDA graph with AdamW: the cross-entropy's target check becomes a
    # device-side assertion there, the rest launches capture-safely after the warm-up.
    from tritonlab.graphs import GraphedStep

    cfg = lm_config("tiny", 64)
    tokens, targets = random_batch(cfg, 2, 64, device="cuda", generator=torch.Generator().manual_seed(3))

    def build():
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = TransformerLM(cfg, our_components())
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)

    model, optimizer = build()
    plain = []
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            loss = model.loss(tokens, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        plain.append(loss.detach().float())
    graphed_model, graphed_optimizer = build()
    step = GraphedStep(graphed_model, graphed_optimizer, graphed_model.loss, (tokens, targets), warmup=2,
                       autocast_dtype=torch.bfloat16)  # fmt: skip
    graphed = [step.step(tokens, targets).float().clone() for _ in range(3)]
    # flash2's backward adds dQ with atomics: not bitwise, within bf16 rounding of the update.
    assert rel_err(torch.stack(graphed), torch.stack(plain)) < 1e-2, (graphed, plain)
    for p, q in zip(graphed_model.parameters(), model.parameters(), strict=True):
        assert rel_err(p.detach(), q.detach()) < 1e-2
