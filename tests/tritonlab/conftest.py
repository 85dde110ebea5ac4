"""Checks the kernel tests of tritonlab.mlp, tritonlab.grouped_gemm and tritonlab.gmm share, as fixtures:
a kernel under autocast, a kernel plugged into the TransformerNP in place of its eager component,
and (the attention's tests too) a public function under torch.compile and the custom ops it becomes."""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._subclasses.fake_tensor import FakeTensorMode

from tritonlab.models import Components, TNPConfig, TransformerNP, sample_tasks
from tritonlab.testing import output_and_grads, rel_err

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


def _compiled_matches_eager(fn, inputs, grad_out, tol: float, backend: str = "aot_eager"):
    """``torch.compile(fn, fullgraph=True, backend=backend)`` traces fn into one graph (a break would
    raise) in which our kernels are ``tritonlab::`` custom ops, and gives eager fn's output and input
    gradients within ``tol`` (``rel_err``), shapes and dtypes alike, on fresh leaves with the inputs'
    layouts. Returns the compiled function, for checks against a reference."""
    torch._dynamo.reset()  # no graphs of an earlier test in the cache, no recompile limit reached
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(fn, fullgraph=True, backend=counter)
    got = output_and_grads(compiled, inputs, grad_out)
    want = output_and_grads(fn, inputs, grad_out)
    assert counter.frame_count == 1 and "torch.ops.tritonlab." in counter.graphs[0].code
    for name, g, w in zip(["output", *range(len(inputs))], got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        assert rel_err(g, w) <= tol, (name, rel_err(g, w))
    return compiled


def _custom_op_checks(op, *args) -> None:
    """``torch.library.opcheck`` of ``op`` on ``args`` (its schema, autograd registration, fake
    implementation and AOT dispatch), and every output of the fake implementation has the real
    output's shape, dtype and strides -- opcheck leaves the strides of a custom op's outputs
    unchecked, and Inductor lays out what reads them by the fake's."""
    torch.library.opcheck(op, args)
    real = op(*args)
    with FakeTensorMode() as mode:
        fake = op(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
    real, fake = ((r,) if isinstance(r, torch.Tensor) else r for r in (real, fake))
    layouts = [[(t.shape, t.dtype, t.stride()) for t in outputs] for outputs in (fake, real)]
    assert layouts[0] == layouts[1], layouts


@pytest.fixture
def compiled_matches_eager():
    return _compiled_matches_eager


@pytest.fixture
def custom_op_checks():
    return _custom_op_checks


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
