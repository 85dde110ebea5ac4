"""tritonlab.graphs: the argument checks and the capture error's diagnosis on any machine; on a GPU, the
graphed TransformerNP step matches the plain one over 5 steps (SDPA and our Triton components, eager
and under torch.compile) and a component that synchronises with the host gives a clear error."""

import pytest
import torch

from tritonlab.graphs import GraphCaptureError, GraphedStep, _explain, check_capturable
from tritonlab.models import Components, TNPConfig, build, sample_tasks, sdpa_attention, train_step

ON_GPU = torch.cuda.is_available()


def _model():
    return torch.nn.Linear(4, 1)


def _inputs():
    return (torch.randn(3, 4),)


def test_the_optimizer_must_be_capturable():
    model = _model()
    with pytest.raises(ValueError, match=r"optimizer: .*capturable=True.*capturable=False"):
        GraphedStep(model, torch.optim.AdamW(model.parameters()), lambda x: model(x).sum(), _inputs())
    with pytest.raises(ValueError, match="optimizer: .*SGD: it has no capturable option"):
        check_capturable(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="optimizer: expected a torch.optim.Optimizer"):
        check_capturable(object())
    check_capturable(torch.optim.AdamW(model.parameters(), capturable=True))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"warmup": 0}, "warmup: at least 1"),
        ({"example_inputs": ()}, "example_inputs"),
        ({"loss_fn": 3}, "loss_fn"),
    ],
)
def test_bad_arguments_are_value_errors_naming_them(kwargs, match):
    model = _model()
    args = {
        "model": model,
        "optimizer": torch.optim.AdamW(model.parameters(), capturable=True),
        "loss_fn": lambda x: model(x).sum(),
        "example_inputs": _inputs(),
        **kwargs,
    }
    with pytest.raises(ValueError, match=match):
        GraphedStep(**args)


@pytest.mark.skipif(ON_GPU, reason="what a machine without CUDA says")
def test_without_cuda_it_says_graphs_need_a_gpu():
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), capturable=True)
    with pytest.raises(RuntimeError, match="CUDA graphs need a CUDA GPU"):
        GraphedStep(model, optimizer, lambda x: model(x).sum(), _inputs())


def _reads_a_device_value():
    raise RuntimeError("CUDA error: operation not permitted when stream is capturing")


def test_the_warm_up_snapshot_sits_in_host_memory_and_restores_in_place():
    # the snapshot and restore logic alone (the constructor needs a GPU): a model, AdamW with state
    # from one step, a snapshot, a second step (the "warm-up"), then the restore
    model = torch.nn.Linear(5, 3)
    extra = torch.nn.Parameter(torch.randn(2))  # no state before the warm-up: zeroed on restore
    optimizer = torch.optim.AdamW([*model.parameters(), extra], lr=0.1)
    params = [*model.parameters()]
    model(torch.randn(4, 5)).sum().backward()
    optimizer.step()
    graphed = object.__new__(GraphedStep)
    graphed.optimizer = optimizer
    saved = graphed._snapshot([*params, extra])
    before = [p.detach().clone() for p in params]
    moments = {id(p): optimizer.state[p]["exp_avg"].clone() for p in params}
    assert all(t.device.type == "cpu" for t in saved[0])
    assert all(
        t.untyped_storage().data_ptr() != p.untyped_storage().data_ptr()
        for t, p in zip(saved[0][:2], params, strict=True)
    )
    addresses = [p.data_ptr() for p in params]
    (model(torch.randn(4, 5)).sum() + extra.sum()).backward()
    optimizer.step()
    assert not torch.equal(params[0], before[0]) and optimizer.state[extra]
    graphed._restore([*params, extra], saved)
    assert [p.data_ptr() for p in params] == addresses
    for p, b in zip(params, before, strict=True):
        assert torch.equal(p, b) and torch.equal(optimizer.state[p]["exp_avg"], moments[id(p)])
    assert not optimizer.state[extra]["exp_avg"].any() and float(optimizer.state[extra]["step"]) == 0


def test_the_capture_error_names_the_stage_the_function_and_the_cause():
    try:
        try:
            _reads_a_device_value()
        except RuntimeError:  # as torch's capture_end then fails too, chaining the first error
            raise RuntimeError(
                "CUDA error: operation failed due to a previous error during capture"
            ) from None
    except RuntimeError as err:
        chained = err
    chained.__context__ = None
    try:
        _reads_a_device_value()
    except RuntimeError as err:
        first = err
    chained.__context__ = first
    text = _explain(chained, "backward")
    assert "the backward failed in _reads_a_device_value (" in text and "test_graphs.py" in text
    assert "synchronises with the host" in text and "operation not permitted" in text
    plain = _explain(ValueError("shapes differ"), "forward")
    assert "it raised during capture" in plain and "ValueError: shapes differ" in plain


# --- on a GPU ---------------------------------------------------------------------------------------

CFG = TNPConfig(n_layers=2, n_heads=4, head_dim=64, d_ff=1365, n_components=10, d_head_hidden=256)


def _triton_components() -> Components:
    from tritonlab.attention import attention
    from tritonlab.gmm import gmm_nll
    from tritonlab.grouped_gemm import gmm_heads
    from tritonlab.mlp import fused_mlp

    return Components(attention=attention, mlp=fused_mlp, heads=gmm_heads, loss=gmm_nll)


def _tasks():
    return sample_tasks(4, 64, 100, device="cuda", generator=torch.Generator("cuda").manual_seed(1))


def _loss_fn(model, compiled: bool):
    if not compiled:
        return model.loss
    torch._dynamo.reset()
    return torch.compile(model.loss, dynamic=False, fullgraph=True)


def _plain(components, steps, tasks, compiled=False):
    model, optimizer = build(CFG, components(), seed=0, device="cuda")
    loss_fn = _loss_fn(model, compiled)
    losses = [train_step(model, loss_fn, optimizer, tasks, torch.bfloat16) for _ in range(steps)]
    return torch.stack(losses), [p.detach().clone() for p in model.parameters()]


def _graphed(components, steps, tasks, compiled=False):
    model, _ = build(CFG, components(), seed=0, device="cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, fused=True, capturable=True)
    loss_fn = _loss_fn(model, compiled)
    graphed = GraphedStep(model, optimizer, loss_fn, tasks, warmup=3, autocast_dtype=torch.bfloat16)
    losses = [graphed.step(*tasks).clone() for _ in range(steps)]
    return torch.stack(losses), [p.detach().clone() for p in model.parameters()]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sdpa-cudnn", "triton", "compile+triton"])
def test_the_graphed_step_matches_the_plain_step_over_5_steps(name):
    """A compiled loss (torch.compile, fullgraph, our kernels as custom ops) is captured too: its
    replays match the plain compiled step's."""
    compiled = name.startswith("compile+")
    components = {
        "sdpa-cudnn": lambda: Components(attention=sdpa_attention("cudnn")),
        "triton": _triton_components,
    }[name.removeprefix("compile+")]
    tasks = _tasks()
    ref_losses, ref_params = _plain(components, 5, tasks, compiled)
    again_losses, again_params = _plain(components, 5, tasks, compiled)
    losses, params = _graphed(components, 5, tasks, compiled)
    start = [p.detach() for p in build(CFG, components(), seed=0, device="cuda")[0].parameters()]
    deterministic = torch.equal(again_losses, ref_losses) and all(
        torch.equal(a, b) for a, b in zip(again_params, ref_params, strict=True)
    )
    if name.endswith("triton"):
        assert deterministic, "the Triton components' step should be bitwise reproducible"
    if deterministic:
        assert torch.equal(losses, ref_losses), (losses, ref_losses)
        for p, q in zip(params, ref_params, strict=True):
            assert torch.equal(p, q), (p - q).abs().max()
        return
    # Not bitwise reproducible (cuDNN's backward): within the phase's bf16 tolerance.
    assert ((losses - ref_losses).abs() <= 1e-2 * ref_losses.abs()).all(), (losses, ref_losses)
    err = sum(float((p - q).square().sum()) for p, q in zip(params, ref_params, strict=True)) ** 0.5
    update = sum(float((q - s).square().sum()) for q, s in zip(ref_params, start, strict=True)) ** 0.5
    assert err <= 0.1 * update, (err, update)


class _SyncingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        if not torch.isfinite(g).all().item():  # reads a device value on the host
            raise FloatingPointError("non-finite gradient")
        return g


def _loss_checked_on_host(params, y):
    from tritonlab.models import gmm_nll

    loss = gmm_nll(params, y)
    if not torch.isfinite(loss).item():  # reads a device value on the host
        raise FloatingPointError("non-finite loss")
    return loss


def _mlp_checked_in_backward(x, w1, w2):
    from tritonlab.models import mlp_eager

    return _SyncingBackward.apply(mlp_eager(x, w1, w2))


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("components", "stage", "culprit"),
    [
        (
            Components(attention=sdpa_attention("cudnn"), loss=_loss_checked_on_host),
            "forward",
            "_loss_checked_on_host",
        ),
        (Components(attention=sdpa_attention("cudnn"), mlp=_mlp_checked_in_backward), "backward", "backward"),
    ],
)
def test_a_component_that_syncs_the_host_gives_a_clear_error(components, stage, culprit):
    tasks = _tasks()
    model, _ = build(CFG, components, seed=0, device="cuda")
    optimizer = torch.optim.AdamW(model.parameters(), fused=True, capturable=True)
    with pytest.raises(GraphCaptureError, match=f"the {stage} failed in {culprit}") as err:
        GraphedStep(model, optimizer, model.loss, tasks, warmup=1, autocast_dtype=torch.bfloat16)
    assert isinstance(err.value, RuntimeError) and "synchronises with the host" in str(err.value)
    # The device is still usable: random numbers and an eager step after the failed capture.
    assert torch.randn(3, device="cuda").isfinite().all()
    plain, plain_optimizer = build(CFG, Components(attention=sdpa_attention("cudnn")), seed=0, device="cuda")
    assert torch.isfinite(train_step(plain, plain.loss, plain_optimizer, tasks, torch.bfloat16)).item()


@pytest.mark.gpu
def test_step_refuses_a_batch_of_another_shape():
    tasks = _tasks()
    model, _ = build(CFG, Components(attention=sdpa_attention("cudnn")), seed=0, device="cuda")
    optimizer = torch.optim.AdamW(model.parameters(), fused=True, capturable=True)
    graphed = GraphedStep(model, optimizer, model.loss, tasks, warmup=1, autocast_dtype=torch.bfloat16)
    other = sample_tasks(2, 64, 100, device="cuda")
    with pytest.raises(ValueError, match=r"inputs\[0\]: the graph was captured for \(4, 64, 1\)"):
        graphed.step(*other)
