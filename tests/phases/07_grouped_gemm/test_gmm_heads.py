"""Phase 07's grouped heads against a float64 reference: values, gradients, the model, bad input."""

import importlib

import pytest
import torch

import common

p07 = importlib.import_module("phases.07_grouped_gemm")
baseline = importlib.import_module("phases.01_baseline")
checks = importlib.import_module("tests.phases.06_fused_mlp.float64_checks")
DEVICE = common.DEVICE
_t = checks.random_tensor


def random_heads(T, n_heads, d_model, d_hidden, dtype):
    z = torch.randn(T, d_model, device=DEVICE)
    w1 = torch.randn(n_heads, d_hidden, d_model, device=DEVICE) / d_model**0.5
    w2 = torch.randn(n_heads, 3, d_hidden, device=DEVICE) / d_hidden**0.5
    return [t.to(dtype) for t in (z, w1, w2)], torch.randn(T, n_heads, 3, device=DEVICE).to(dtype)


def check(fn, inputs, grad_out, tol):
    checks.check_against_float64(
        fn, baseline.gmm_heads_loop, inputs, grad_out, tol, ["out", "dz", "dw1", "dw2"]
    )


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


@pytest.mark.parametrize("T", [1, 37])
def test_saved_preactivation_matches_float64(T):
    # The backward reads the pre-activation the forward kept (3 heads: the group stride of a).
    inputs, grad_out = random_heads(T, 3, 32, 300, torch.float32)
    check(lambda z, w1, w2: p07.gmm_heads(z, w1, w2, save_preactivation=True), inputs, grad_out, 1e-5)


def test_real_weight_shapes():
    inputs, grad_out = random_heads(1, 10, 512, 1365, torch.float32)
    check(p07.gmm_heads, inputs, grad_out, 1e-5)


def test_bmm_baseline_matches():
    inputs, grad_out = random_heads(37, 3, 32, 100, torch.float32)
    check(p07.gmm_heads_bmm, inputs, grad_out, 1e-5)


def test_plugs_into_the_model():
    checks.check_plugs_into_the_model("heads", baseline.gmm_heads_loop, p07.gmm_heads, n_layers=1)


def test_autocast_casts_weights():
    z = torch.randn(11, 32, device=DEVICE)
    w1 = torch.randn(3, 40, 32, device=DEVICE, requires_grad=True)
    w2 = torch.randn(3, 3, 40, device=DEVICE, requires_grad=True)
    checks.check_autocast_casts_weights(baseline.gmm_heads_loop, p07.gmm_heads, z, w1, w2)


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
@pytest.mark.parametrize("save", [False, True])
def test_gpu_bf16_real_shapes_match_float64(T, save):
    inputs, grad_out = random_heads(T, 10, 512, 1365, torch.bfloat16)
    check(lambda z, w1, w2: p07.gmm_heads(z, w1, w2, save_preactivation=save), inputs, grad_out, 1.5e-2)
