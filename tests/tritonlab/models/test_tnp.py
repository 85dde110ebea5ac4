"""tritonlab.models: the GMM loss, the rectangular attention, the model's shapes and gradients, training,
and the model with our kernels under torch.compile (fullgraph) against eager."""

import functools
import math

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from tritonlab import attention as attn
from tritonlab import models as baseline
from tritonlab.gmm import gmm_nll
from tritonlab.grouped_gemm import gmm_heads
from tritonlab.mlp import fused_mlp
from tritonlab.testing import rel_err

TINY = baseline.TNPConfig(n_layers=2, n_heads=2, head_dim=16, d_ff=48, n_components=3, d_head_hidden=24)


def gmm_nll_float64_reference(params, y):
    """Mixture density summed directly (not in log space), in float64: an independent formula."""
    p = params.double()
    weights = torch.softmax(p[..., 0], dim=-1)
    sigma = torch.exp(p[..., 2])
    density = torch.exp(-0.5 * ((y.double()[:, None] - p[..., 1]) / sigma) ** 2) / (
        sigma * math.sqrt(2 * math.pi)
    )
    return -torch.log((weights * density).sum(-1)).mean()


@pytest.mark.parametrize("T", [1, 7, 131])
def test_gmm_nll_matches_float64_reference(T):
    params = torch.randn(T, 10, 3) * torch.tensor([2.0, 1.0, 0.3])
    y = torch.randn(T)
    ours = baseline.gmm_nll(params, y)
    ref = gmm_nll_float64_reference(params, y)
    assert ours.dtype == torch.float32
    assert abs(ours.item() - ref.item()) <= 1e-5 * max(1.0, abs(ref.item()))
    assert torch.equal(baseline.gmm_nll(params, y[:, None]), ours)  # (T, 1) targets too


def test_gmm_nll_stays_finite_far_from_every_component():
    params = torch.zeros(4, 10, 3)
    params[..., 2] = -20.0  # sigma = 2e-9
    y = torch.full((4,), 1e3)
    loss = baseline.gmm_nll(params, y)
    assert torch.isfinite(loss) and loss > 1e20  # far out in the tail, but a number


@pytest.mark.parametrize("backend", ["math", "flash"])
@pytest.mark.parametrize(("Lq", "Lk"), [(1, 1), (17, 5), (100, 64)])
def test_rectangular_sdpa_matches_explicit_softmax(backend, Lq, Lk):
    B, H, D = 2, 3, 16
    q, k, v = torch.randn(B, H, Lq, D), torch.randn(B, H, Lk, D), torch.randn(B, H, Lk, D)
    out = baseline.sdpa_attention(backend)(q, k, v)
    weights = torch.softmax(q.double() @ k.double().transpose(-1, -2) / math.sqrt(D), dim=-1)
    ref = weights @ v.double()
    assert out.shape == (B, H, Lq, D)
    assert torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref) < 1e-5


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="sdpa backend"):
        baseline.sdpa_attention("fastest")


def make_tasks(B=2, M=9, N=5, seed=0):
    return baseline.sample_tasks(B, M, N, generator=torch.Generator().manual_seed(seed))


def test_model_shapes_and_gradients():
    torch.manual_seed(0)
    model = baseline.TransformerNP(TINY)
    xc, yc, xt, yt = make_tasks()
    params = model(xc, yc, xt)
    assert params.shape == (2 * 5, TINY.n_components, 3)
    loss = model.loss(xc, yc, xt, yt)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"{name} gets no gradient"


def test_targets_only_see_the_context():
    """Rectangular attention: changing one target's x moves only that target's prediction."""
    torch.manual_seed(0)
    model = baseline.TransformerNP(TINY).double()
    xc, yc, xt, _ = (t.double() for t in make_tasks(B=1))
    before = model(xc, yc, xt)
    xt2 = xt.clone()
    xt2[0, 3] += 0.5
    after = model(xc, yc, xt2)
    changed = (after - before).abs().amax(dim=(1, 2)) > 1e-12
    assert changed.tolist() == [False, False, False, True, False]


def test_data_is_reproducible_and_shaped():
    a, b = make_tasks(seed=3), make_tasks(seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert a.xc.shape == (2, 9, 1) and a.yt.shape == (2, 5, 1)
    assert a.yc.std() > 0.1  # real functions, not zeros


def our_components(attention: str) -> baseline.Components:
    """The model's four components as our kernels, as phase 12's custom variants build them ("fused-kv":
    the fused attention over the packed K/V projection, as phase 12's fused variants take it)."""
    fn = {"separate": attn.attention, "fused": attn.fused_attention, "fused-kv": attn.fused_attention}[
        attention
    ]
    packed = attn.fused_attention_kv if attention == "fused-kv" else None
    return baseline.Components(
        attention=fn, attention_kv=packed, mlp=fused_mlp, heads=gmm_heads, loss=gmm_nll
    )


def compiled_and_eager_loss(cfg, components, tasks, backend: str, dtype=None, checkpoint="none") -> list:
    """(loss, {name: gradient}) of one step from the same weights: eager, then
    ``torch.compile(model.loss, fullgraph=True)`` -- one graph, with no break."""
    results = []
    for compiled in (False, True):
        torch._dynamo.reset()
        model, _ = baseline.build(cfg, components, seed=0, device=tasks.xc.device, checkpoint=checkpoint)
        counter = CompileCounterWithBackend(backend)
        loss_fn = torch.compile(model.loss, fullgraph=True, backend=counter) if compiled else model.loss
        with baseline.autocast(dtype):
            loss = loss_fn(*tasks)
        loss.backward()
        assert counter.frame_count == int(compiled)
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    return results


@pytest.mark.parametrize("attention", ["separate", "fused", "fused-kv"])
def test_compiled_model_with_our_kernels_matches_eager(attention):
    (eager_loss, eager_grads), (loss, grads) = compiled_and_eager_loss(
        TINY, our_components(attention), make_tasks(), "aot_eager"
    )
    assert rel_err(loss, eager_loss) < 1e-5
    for name, g in grads.items():
        assert rel_err(g, eager_grads[name]) < 1e-4, name


def test_packed_kv_attention_leaves_the_step_unchanged():
    """attention_kv set: the attention block calls it on the packed K/V projection; loss and every
    gradient are those of the same kernels over K and V apart (deterministic backward, eager)."""
    fused = functools.partial(attn.fused_attention, deterministic=True)
    packed = functools.partial(attn.fused_attention_kv, deterministic=True)
    tasks, results = make_tasks(), []
    for attention_kv in (None, packed):
        components = baseline.Components(attention=fused, attention_kv=attention_kv)
        model, _ = baseline.build(TINY, components, seed=0, device=tasks.xc.device)
        loss = model.loss(*tasks)
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss_apart, grads_apart), (loss_packed, grads_packed) = results
    assert torch.equal(loss_packed, loss_apart)
    for name, g in grads_packed.items():
        assert torch.equal(g, grads_apart[name]), name


@pytest.mark.parametrize("checkpoint", ["block", "selective", "mlp"])
def test_compiled_checkpointed_model_with_our_kernels_matches_eager(checkpoint):
    # Phase 12 compiles checkpointed custom variants too: the recompute must trace through our ops.
    (eager_loss, eager_grads), (loss, grads) = compiled_and_eager_loss(
        TINY, our_components("separate"), make_tasks(), "aot_eager", checkpoint=checkpoint
    )
    assert rel_err(loss, eager_loss) < 1e-5
    for name, g in grads.items():
        assert rel_err(g, eager_grads[name]) < 1e-4, name


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["separate", "fused"])
def test_inductor_bf16_model_with_our_kernels_matches_eager_on_gpu(attention):
    # The spec's dims with 2 layers, at the small shape (B = 64 tasks of M = 64, N = 500), bf16 autocast.
    small = baseline.resolve_shape("small")
    tasks = baseline.sample_tasks(
        small.batch, small.m_context, small.n_target, device="cuda",
        generator=torch.Generator("cuda").manual_seed(0),
    )  # fmt: skip
    (eager_loss, eager_grads), (loss, grads) = compiled_and_eager_loss(
        baseline.TNPConfig(n_layers=2), our_components(attention), tasks, "inductor", torch.bfloat16
    )
    assert rel_err(loss, eager_loss) < 2e-2
    for name, g in grads.items():
        assert rel_err(g, eager_grads[name]) < 5e-2, name


def test_loss_decreases_when_training():
    from tritonlab.models import TNPShape

    curve = list(
        baseline.train_loss_curve(
            TINY, baseline.Components(), TNPShape("t", 24, 12, 8), "fp32", steps=60, log_every=10, lr=3e-3
        )
    )
    first, last = curve[0][1], curve[-1][1]
    assert last < first - 0.2, curve
