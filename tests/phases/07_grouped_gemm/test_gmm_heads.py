"""Phase 07's grouped heads against a float64 reference: values, gradients, the model, bad input."""

import importlib

import pytest
import torch

import common

p07 = importlib.import_module("phases.07_grouped_gemm")
baseline = importlib.import_module("phases.01_baseline")
DEVICE = common.DEVICE


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def random_heads(T, n_heads, d_model, d_hidden, dtype):
    z = torch.randn(T, d_model, device=DEVICE)
    w1 = torch.randn(n_heads, d_hidden, d_model, device=DEVICE) / d_model**0.5
    w2 = torch.randn(n_heads, 3, d_hidden, device=DEVICE) / d_hidden**0.5
    return [t.to(dtype) for t in (z, w1, w2)], torch.randn(T, n_heads, 3, device=DEVICE).to(dtype)


def output_and_grads(fn, inputs, grad_out):
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*inputs)
    return [out, *torch.autograd.grad(out, inputs, grad_out)]


def check(fn, inputs, grad_out, tol):
    got = output_and_grads(fn, inputs, grad_out)
    want = output_and_grads(baseline.gmm_heads_loop, [t.double() for t in inputs], grad_out.double())
    for name, g, w in zip(["out", "dz", "dw1", "dw2"], got, want, strict=True):
        assert g.dtype == inputs[0].dtype and g.shape == w.shape, name
        assert torch.isfinite(g).all(), name
        assert rel(g, w) < tol, (name, rel(g, w))


# fp32 at every T; fp16 (slow in the interpreter, same code path) at the two small ones.
@pytest.mark.parametrize(
    ("dtype", "T"),
    [(torch.float32, 1), (torch.float32, 37), (torch.float32, 1001), (torch.float16, 1), (torch.float16, 37)],
)
def test_small_dims_match_float64(dtype, T):
    # d_hidden = 300 is not a multiple of 16 (like 1365) and spans two hidden chunks in the
    # interpreter's config; 3 heads exercise the group axis; T crosses row blocks at 1001.
    inputs, grad_out = random_heads(T, 3, 32, 300, dtype)
    check(p07.gmm_heads, inputs, grad_out, 1e-5 if dtype == torch.float32 else 5e-3)


def test_real_weight_shapes():
    inputs, grad_out = random_heads(1, 10, 512, 1365, torch.float32)
    check(p07.gmm_heads, inputs, grad_out, 1e-5)


def test_bmm_baseline_matches():
    inputs, grad_out = random_heads(37, 3, 32, 100, torch.float32)
    check(p07.gmm_heads_bmm, inputs, grad_out, 1e-5)


def test_plugs_into_the_model():
    cfg = baseline.TNPConfig(n_layers=1, n_heads=2, head_dim=16, d_ff=40, n_components=3, d_head_hidden=24)
    tasks = baseline.sample_tasks(2, 7, 5, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(0))
    results = []
    for heads in (baseline.gmm_heads_loop, p07.gmm_heads):
        torch.manual_seed(0)
        model = baseline.TransformerNP(cfg, baseline.Components(heads=heads)).to(DEVICE)
        loss = model.loss(*tasks)
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
    (eager_loss, eager_grads), (fused_loss, fused_grads) = results
    assert rel(fused_loss, eager_loss) < 1e-5
    for g_fused, g_eager in zip(fused_grads, eager_grads, strict=True):
        assert rel(g_fused, g_eager) < 1e-4


def test_autocast_casts_weights():
    z = torch.randn(11, 32, device=DEVICE)
    w1 = torch.randn(3, 40, 32, device=DEVICE, requires_grad=True)
    w2 = torch.randn(3, 3, 40, device=DEVICE, requires_grad=True)
    half = torch.float16 if DEVICE.type == "cpu" else torch.bfloat16  # the interpreter's bf16 dot is wrong
    results = []
    for fn in (baseline.gmm_heads_loop, p07.gmm_heads):
        with torch.autocast(DEVICE.type, dtype=half):
            out = fn(z, w1, w2)
        results.append([out, *torch.autograd.grad(out.float().square().sum(), [w1, w2])])
    (out_eager, *g_eager), (out_fused, *g_fused) = results
    assert out_fused.dtype == out_eager.dtype == half
    assert rel(out_fused, out_eager) < 1e-2
    for g, e in zip(g_fused, g_eager, strict=True):
        assert g.dtype == torch.float32 and rel(g, e) < 2e-2


def _t(*shape, dtype=torch.float32, device=None):
    return torch.randn(*shape, device=device or DEVICE).to(dtype)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((_t(5, 32), _t(3, 40, 16), _t(3, 3, 40)), "w1: expected \\(G, F, 32\\)"),
        ((_t(5, 32), _t(3, 40, 32), _t(2, 3, 40)), "w2: expected \\(3, N_OUT, 40\\)"),
        ((_t(5, 32), _t(3, 40, 32), _t(3, 17, 40)), "at most 16 outputs"),
        ((_t(5, 32, 1), _t(3, 40, 32), _t(3, 3, 40)), "shapes"),
        ((_t(5, 32), _t(3, 40, 32, dtype=torch.float16), _t(3, 3, 40)), "dtypes"),
        ((_t(5, 32), _t(3, 40, 32, dtype=torch.int64), _t(3, 3, 40)), "w1: dtype"),
        ((_t(5, 24), _t(3, 40, 24), _t(3, 3, 40)), "multiple of 16"),
        ((_t(5, 32), _t(3, 40, 32), _t(3, 3, 40, device="meta")), "w2: must be on"),
    ],
)
def test_bad_input_raises(args, message):
    with pytest.raises(ValueError, match=message):
        p07.gmm_heads(*args)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 37, 1001])
def test_gpu_bf16_real_shapes_match_float64(T):
    inputs, grad_out = random_heads(T, 10, 512, 1365, torch.bfloat16)
    check(p07.gmm_heads, inputs, grad_out, 1.5e-2)
