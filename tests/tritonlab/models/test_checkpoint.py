"""tritonlab.models' activation checkpointing: every mode gives the plain model's loss and gradients,
with PyTorch's attention and with the library's Triton kernels; each keeps less for the backward;
a bad mode is a ValueError naming the argument."""

import pytest
import torch

from tritonlab.models import (
    CHECKPOINT_MODES,
    Components,
    TNPConfig,
    TransformerNP,
    build,
    check_checkpoint,
    sample_tasks,
    sdpa_attention,
)
from tritonlab.testing import rel_err

TINY = TNPConfig(n_layers=2, n_heads=2, head_dim=16, d_ff=40, n_components=3, d_head_hidden=24)


def _tasks(B=2, M=7, N=5):
    return sample_tasks(B, M, N, generator=torch.Generator().manual_seed(0))


def _loss_and_grads(components, mode, dtype=None):
    torch.manual_seed(0)
    model = TransformerNP(TINY, components, checkpoint=mode)
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        loss = model.loss(*_tasks())
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


def _triton_attention():
    from tritonlab.attention import attention

    return attention


def _triton_fused_attention():
    from tritonlab.attention import fused_attention

    return fused_attention


ATTENTIONS = {
    "sdpa-math": lambda: sdpa_attention("math"),
    "sdpa-flash": lambda: sdpa_attention("flash"),
    "triton": _triton_attention,
    "triton-fused": _triton_fused_attention,
}


@pytest.mark.parametrize("attention", list(ATTENTIONS))
@pytest.mark.parametrize("mode", [m for m in CHECKPOINT_MODES if m != "none"])
def test_checkpointing_gives_the_plain_loss_and_gradients(mode, attention):
    components = Components(attention=ATTENTIONS[attention]())
    plain_loss, plain_grads = _loss_and_grads(components, "none")
    loss, grads = _loss_and_grads(components, mode)
    assert rel_err(loss, plain_loss) <= 1e-6
    assert grads.keys() == plain_grads.keys()
    for name, grad in grads.items():
        assert grad is not None and rel_err(grad, plain_grads[name]) <= 1e-6, name


@pytest.mark.parametrize("mode", [m for m in CHECKPOINT_MODES if m != "none"])
def test_the_recompute_runs_under_the_forwards_autocast(mode):
    components = Components()
    plain_loss, plain_grads = _loss_and_grads(components, "none", torch.bfloat16)
    loss, grads = _loss_and_grads(components, mode, torch.bfloat16)
    assert rel_err(loss, plain_loss) <= 1e-6
    for name, grad in grads.items():
        assert rel_err(grad, plain_grads[name]) <= 1e-6, name


def _bytes_kept_outside_recomputed_regions(mode) -> int:
    """Bytes autograd keeps for the backward, weights aside, apart from what checkpoint regions keep
    (their own hooks take those over: a region keeps its inputs, which the block's input dominates)."""
    torch.manual_seed(0)
    model = TransformerNP(TINY, checkpoint=mode)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.loss(*_tasks(B=4, M=33, N=17))
    return sum(n for ptr, n in kept.items() if ptr not in weights)


def test_each_mode_keeps_less_than_the_plain_model():
    kept = {mode: _bytes_kept_outside_recomputed_regions(mode) for mode in CHECKPOINT_MODES}
    assert kept["block"] < kept["selective"] < kept["mlp"] < kept["none"], kept


def test_the_mode_can_change_on_a_built_model_and_inference_is_unchanged():
    torch.manual_seed(0)
    model = TransformerNP(TINY)
    assert model.checkpoint == "none"
    xc, yc, xt, _ = _tasks()
    with torch.no_grad():
        plain = model(xc, yc, xt)
        model.checkpoint = "selective"
        assert torch.equal(model(xc, yc, xt), plain)
    model, _ = build(TINY, Components(), device="cpu", checkpoint="block")
    assert model.checkpoint == "block"


def test_a_bad_mode_is_a_value_error_naming_the_argument():
    for bad in ("all", "", "Block", None):
        with pytest.raises(
            ValueError, match="checkpoint: unknown mode .* expected one of none, block, selective, mlp"
        ):
            TransformerNP(TINY, checkpoint=bad)
    model = TransformerNP(TINY)
    with pytest.raises(ValueError, match="checkpoint"):
        model.checkpoint = "blocks"
    assert model.checkpoint == "none"
    with pytest.raises(ValueError, match="checkpoint"):
        build(TINY, Components(), device="cpu", checkpoint="on")
    with pytest.raises(ValueError, match="checkpoint"):
        model.blocks[0](torch.zeros(1, 3, TINY.d_model), 2, "full")
    assert check_checkpoint("mlp") == "mlp"
