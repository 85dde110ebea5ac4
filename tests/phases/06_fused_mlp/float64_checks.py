"""Checks the tests of phases 06-08 share: a kernel's output and gradients against a float64 reference,
autocast, and the kernel plugged into the model. Phases 07, 08 and flash2 load this module with
importlib."""

import importlib

import torch

import common

baseline = importlib.import_module("phases.01_baseline")
DEVICE = common.DEVICE


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def random_tensor(*shape, dtype=torch.float32, device=None):
    return torch.randn(*shape, device=device or DEVICE).to(dtype)


def same_layout_leaf(t):
    """A fresh leaf with t's values and t's very strides. ``clone()`` would make a view with gaps
    (every second column, one of q/k/v in a fused projection) dense, and the test would no longer
    pass the layout it means to."""
    copy = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return copy.copy_(t.detach()).requires_grad_()


def output_and_grads(fn, inputs, grad_out):
    inputs = [same_layout_leaf(t) for t in inputs]
    out = fn(*inputs)
    return [out, *torch.autograd.grad(out, inputs, grad_out)]


def check_against_float64(fn, reference, inputs, grad_out, tol, names):
    """fn's output and input gradients (``names``, in that order) vs ``reference`` run in float64."""
    got = output_and_grads(fn, inputs, grad_out)
    want = output_and_grads(reference, [t.double() for t in inputs], grad_out.double())
    for name, g, w in zip(names, got, want, strict=True):
        assert g.dtype == inputs[0].dtype and g.shape == w.shape, name
        assert torch.isfinite(g).all(), name
        assert rel(g, w) < tol, (name, rel(g, w))


def check_autocast_casts_weights(eager, kernel, x, w1, w2):
    """Under autocast, fp32 weights are cast as F.linear casts them; returns the kernel's output."""
    half = torch.float16 if DEVICE.type == "cpu" else torch.bfloat16  # the interpreter's bf16 dot is wrong
    results = []
    for fn in (eager, kernel):
        with torch.autocast(DEVICE.type, dtype=half):
            out = fn(x, w1, w2)
        results.append([out, *torch.autograd.grad(out.float().square().sum(), [w1, w2])])
    (out_eager, *g_eager), (out_kernel, *g_kernel) = results
    assert out_kernel.dtype == out_eager.dtype == half
    assert rel(out_kernel, out_eager) < 1e-2
    for g, e in zip(g_kernel, g_eager, strict=True):
        assert g.dtype == torch.float32 and rel(g, e) < 2e-2
    return out_kernel


def check_plugs_into_the_model(slot, eager, kernel, n_layers):
    """The model's loss and every parameter gradient with ``kernel`` as its ``slot`` component (e.g.
    ``"mlp"``) match those with ``eager`` there."""
    cfg = baseline.TNPConfig(
        n_layers=n_layers, n_heads=2, head_dim=16, d_ff=40, n_components=3, d_head_hidden=24
    )
    tasks = baseline.sample_tasks(2, 7, 5, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(0))
    results = []
    for fn in (eager, kernel):
        torch.manual_seed(0)
        model = baseline.TransformerNP(cfg, baseline.Components(**{slot: fn})).to(DEVICE)
        loss = model.loss(*tasks)
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
    (eager_loss, eager_grads), (kernel_loss, kernel_grads) = results
    assert rel(kernel_loss, eager_loss) < 1e-5
    for g_kernel, g_eager in zip(kernel_grads, eager_grads, strict=True):
        assert rel(g_kernel, g_eager) < 1e-4
