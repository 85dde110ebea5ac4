"""Checks the kernel tests of tritonlab.mlp, tritonlab.grouped_gemm and tritonlab.gmm share, as fixtures:
a kernel under autocast, and a kernel plugged into the TransformerNP in place of its eager component."""

import pytest
import torch

from tritonlab.models import Components, TNPConfig, TransformerNP, sample_tasks
from tritonlab.testing import rel_err

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _autocast_casts_weights(eager, kernel, x, w1, w2):
    """Under autocast, fp32 weights are cast as F.linear casts them; returns the kernel's output."""
    half = torch.float16 if DEVICE.type == "cpu" else torch.bfloat16  # the interpreter's bf16 dot is wrong
    results = []
    for fn in (eager, kernel):
        with torch.autocast(DEVICE.type, dtype=half):
            out = fn(x, w1, w2)
        results.append([out, *torch.autograd.grad(out.float().square().sum(), [w1, w2])])
    (out_eager, *g_eager), (out_kernel, *g_kernel) = results
    assert out_kernel.dtype == out_eager.dtype == half
    assert rel_err(out_kernel, out_eager) < 1e-2
    for g, e in zip(g_kernel, g_eager, strict=True):
        assert g.dtype == torch.float32 and rel_err(g, e) < 2e-2
    return out_kernel


def _plugs_into_the_model(slot, kernel, n_layers):
    """The model's loss and every parameter gradient with ``kernel`` as its ``slot`` component (e.g.
    ``"mlp"``) match those of the eager model."""
    cfg = TNPConfig(n_layers=n_layers, n_heads=2, head_dim=16, d_ff=40, n_components=3, d_head_hidden=24)
    tasks = sample_tasks(2, 7, 5, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(0))
    results = []
    for components in (Components(), Components(**{slot: kernel})):
        torch.manual_seed(0)
        model = TransformerNP(cfg, components).to(DEVICE)
        loss = model.loss(*tasks)
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
    (eager_loss, eager_grads), (kernel_loss, kernel_grads) = results
    assert rel_err(kernel_loss, eager_loss) < 1e-5
    for g_kernel, g_eager in zip(kernel_grads, eager_grads, strict=True):
        assert rel_err(g_kernel, g_eager) < 1e-4


@pytest.fixture
def autocast_casts_weights():
    return _autocast_casts_weights


@pytest.fixture
def plugs_into_the_model():
    return _plugs_into_the_model


@pytest.fixture
def float32_matmul_precision():
    """Set ``torch.set_float32_matmul_precision`` inside a test; the previous setting comes back after."""
    previous = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(previous)
