"""Phase 04's fused backward: gradients against autograd through float64 attention."""

import importlib

import pytest
import torch
from triton.runtime.errors import OutOfResources

import common

fused = importlib.import_module("phases.04_fused_attn")
fused_module = importlib.import_module("phases.04_fused_attn.fused")
ref = importlib.import_module("phases.02_attn_fwd.reference")

TOLERANCE = {torch.float32: 5e-5, torch.float16: 1e-2, torch.bfloat16: 3e-2}


@pytest.mark.parametrize(
    ("B", "H", "Lq", "Lk", "D", "dtype"),
    [
        (1, 1, 1, 1, 16, torch.float32),
        (2, 3, 17, 100, 32, torch.float32),
        (1, 2, 257, 17, 64, torch.float16),  # several query chunks: partials and their reduction
        (3, 2, 100, 64, 16, torch.float16),
        (2, 2, 70, 9, 32, torch.float16),  # one key block: key programs write dQ as well
    ],
)
def test_gradients_match_float64(B, H, Lq, Lk, D, dtype):
    errors = ref.gradient_errors(fused.attention, B, H, Lq, Lk, D, dtype, common.DEVICE)
    assert max(errors.values()) < TOLERANCE[dtype], errors


def test_large_inputs_give_finite_gradients():
    # Saturated softmax: dQ, dK are ill-conditioned (see phase 03's test); finite, o and dV tight.
    errors = ref.gradient_errors(
        fused.attention, 1, 2, 33, 45, 16, torch.float32, common.DEVICE, scale_inputs=100.0
    )
    assert errors["o"] < 1e-5 and errors["dv"] < 1e-2 and max(errors.values()) < 0.2, errors


def test_fused_is_deterministic_and_agrees_with_two_pass():
    two_pass = importlib.import_module("phases.03_attn_bwd")
    q, k, v = (
        t.requires_grad_() for t in ref.strided_inputs(1, 2, 100, 70, 16, torch.float16, common.DEVICE)
    )
    do = torch.randn_like(q)
    first = torch.autograd.grad(fused.attention(q, k, v), (q, k, v), do)
    second = torch.autograd.grad(fused.attention(q, k, v), (q, k, v), do)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    other = torch.autograd.grad(two_pass.attention(q, k, v), (q, k, v), do)
    assert all(torch.allclose(a.float(), b.float(), atol=2e-3) for a, b in zip(first, other, strict=True))


def test_plugged_into_the_model_matches_sdpa():
    errors = ref.model_gradient_errors(fused.attention)
    assert errors["loss"] < 1e-5 and errors["grads"] < 1e-4, errors


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("B", "H", "Lq", "Lk"),
    [(1, 1, 1, 1), (2, 3, 17, 100), (1, 2, 257, 17), (2, 3, 100, 257), (1, 8, 1100, 1000)],
)
def test_gradients_bf16_on_gpu(B, H, Lq, Lk):
    errors = ref.gradient_errors(fused.attention, B, H, Lq, Lk, 64, torch.bfloat16, common.DEVICE)
    assert max(errors.values()) < TOLERANCE[torch.bfloat16], errors
    errors = ref.gradient_errors(
        fused.attention, B, H, Lq, Lk, 64, torch.bfloat16, common.DEVICE, scale_inputs=100.0
    )
    assert errors["o"] < TOLERANCE[torch.bfloat16], errors


@pytest.mark.gpu
def test_fused_kernel_does_not_spill():
    ref.gradient_errors(fused.attention, 2, 8, 1100, 1000, 64, torch.bfloat16, common.DEVICE)
    report = fused.last_fused_config()
    assert report["n_spills"] == 0, report


@pytest.mark.gpu
def test_plugged_into_the_model_matches_sdpa_bf16_on_gpu():
    errors = ref.model_gradient_errors(fused.attention, dtype="bf16")
    assert errors["loss"] < 2e-2 and errors["grads"] < 5e-2, errors


@pytest.mark.gpu
def test_mid_shape_matches_sdpa_on_gpu():
    errors = ref.errors_against_sdpa(fused.attention, B=4, H=8, Lq=11_000, Lk=10_000)
    assert errors["o"] < 1e-2 and max(errors["dq"], errors["dk"], errors["dv"]) < 3e-2, errors


class _Compiled:
    def __init__(self, n_spills):
        self.n_spills = n_spills


def test_spilling_configs_are_pruned():
    spills = {"a": 30, "b": 0, "c": 8, "d": 0}

    def compile_for_call(config):
        if config == "too-big":
            raise OutOfResources(300_000, 232_448, "shared memory")
        return _Compiled(spills[config])

    assert fused_module._drop_spilling(["a", "b", "too-big", "c", "d"], compile_for_call) == ["b", "d"]
    # Every config spills: the least-spilling one, so that the call still runs (and is reported).
    assert fused_module._drop_spilling(["a", "c", "too-big"], compile_for_call) == ["c"]


@pytest.mark.gpu
def test_direct_launch_respecialises_for_a_misaligned_view():
    # The backward's cached launch is keyed on q, k, v, do including alignment (see phase 02's test).
    B, H, Lq, Lk, D = 1, 2, 100, 70, 64
    ref.gradient_errors(fused.attention, B, H, Lq, Lk, D, torch.bfloat16, common.DEVICE)  # aligned
    for _ in range(2):
        error = ref.misaligned_gradient_error(fused.attention, B, H, Lq, Lk, D, torch.bfloat16, common.DEVICE)
        assert error < TOLERANCE[torch.bfloat16], error
