"""Phase 03's two-pass backward: gradients against autograd through float64 attention."""

import importlib

import pytest
import torch

import common

bwd = importlib.import_module("phases.03_attn_bwd")
ref = importlib.import_module("phases.02_attn_fwd.reference")

TOLERANCE = {torch.float32: 5e-5, torch.float16: 1e-2, torch.bfloat16: 3e-2}


@pytest.mark.parametrize(
    ("B", "H", "Lq", "Lk", "D", "dtype"),
    [
        (1, 1, 1, 1, 16, torch.float32),
        (2, 3, 17, 100, 32, torch.float32),  # one query chunk: dK, dV written directly
        (1, 2, 257, 17, 64, torch.float16),  # several query chunks: partials and their reduction
        (3, 2, 100, 64, 16, torch.float16),
    ],
)
def test_gradients_match_float64(B, H, Lq, Lk, D, dtype):
    errors = ref.gradient_errors(bwd.attention, B, H, Lq, Lk, D, dtype, common.DEVICE)
    assert max(errors.values()) < TOLERANCE[dtype], errors


def test_large_inputs_give_finite_gradients():
    # Scores of ~1e3 saturate the softmax: dQ and dK are then tiny differences of large terms and
    # ill-conditioned in any float format, so beyond being finite only o and dV are held tight.
    errors = ref.gradient_errors(
        bwd.attention, 1, 2, 33, 45, 16, torch.float32, common.DEVICE, scale_inputs=100.0
    )
    assert errors["o"] < 1e-5 and errors["dv"] < 1e-2 and max(errors.values()) < 0.2, errors


def test_query_chunks_split_short_keys_and_stay_whole_for_long_keys():
    align = 128 if common.ON_GPU else bwd.INTERPRETER_CONFIG["BLOCK_M"]
    assert bwd.plan_query_chunks(Lq=100_000, Lk=100_000, n_bh=8) >= 100_000
    chunk = bwd.plan_query_chunks(Lq=2_570, Lk=170, n_bh=2)
    assert chunk < 2_570 and chunk % align == 0


def test_plugged_into_the_model_matches_sdpa():
    errors = ref.model_gradient_errors(bwd.attention)
    assert errors["loss"] < 1e-5 and errors["grads"] < 1e-4, errors


def test_backward_is_deterministic():
    q, k, v = (
        t.requires_grad_() for t in ref.strided_inputs(1, 2, 100, 70, 16, torch.float16, common.DEVICE)
    )
    do = torch.randn_like(q)
    first = torch.autograd.grad(bwd.attention(q, k, v), (q, k, v), do)
    second = torch.autograd.grad(bwd.attention(q, k, v), (q, k, v), do)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("B", "H", "Lq", "Lk"),
    [(1, 1, 1, 1), (2, 3, 17, 100), (1, 2, 257, 17), (2, 3, 100, 257), (1, 8, 1100, 1000)],
)
def test_gradients_bf16_on_gpu(B, H, Lq, Lk):
    errors = ref.gradient_errors(bwd.attention, B, H, Lq, Lk, 64, torch.bfloat16, common.DEVICE)
    assert max(errors.values()) < TOLERANCE[torch.bfloat16], errors
    errors = ref.gradient_errors(
        bwd.attention, B, H, Lq, Lk, 64, torch.bfloat16, common.DEVICE, scale_inputs=100.0
    )
    assert errors["o"] < TOLERANCE[torch.bfloat16], errors  # finite gradients: checked inside


@pytest.mark.gpu
def test_plugged_into_the_model_matches_sdpa_bf16_on_gpu():
    errors = ref.model_gradient_errors(bwd.attention, dtype="bf16")
    assert errors["loss"] < 2e-2 and errors["grads"] < 5e-2, errors


@pytest.mark.gpu
def test_mid_shape_matches_sdpa_on_gpu():
    errors = ref.errors_against_sdpa(bwd.attention, B=4, H=8, Lq=11_000, Lk=10_000)
    assert errors["o"] < 1e-2 and max(errors["dq"], errors["dk"], errors["dv"]) < 3e-2, errors


@pytest.mark.gpu
def test_direct_launches_follow_alignment_and_scale_on_gpu():
    # After the first call of a signature both kernels are launched directly from a cache keyed on
    # the layouts of q, k, v, do: a misaligned view must get its own entry, and a new scale must reach
    # the cached launch.
    B, H, Lq, Lk, D = 1, 2, 100, 70, 64
    ref.gradient_errors(bwd.attention, B, H, Lq, Lk, D, torch.bfloat16, common.DEVICE)  # aligned
    for scale in (None, None, 0.05):
        error = ref.misaligned_gradient_error(
            bwd.attention, B, H, Lq, Lk, D, torch.bfloat16, common.DEVICE, scale
        )
        assert error < TOLERANCE[torch.bfloat16], (scale, error)
