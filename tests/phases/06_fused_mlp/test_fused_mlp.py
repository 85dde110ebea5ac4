"""Phase 06's fused MLP against a float64 reference: values, gradients, autocast, the model, bad input."""

import importlib

import pytest
import torch

import common

p06 = importlib.import_module("phases.06_fused_mlp")
baseline = importlib.import_module("phases.01_baseline")
checks = importlib.import_module("tests.phases.06_fused_mlp.float64_checks")
DEVICE = common.DEVICE
_t = checks.random_tensor

VARIANTS = {
    "fused": lambda x, w1, w2: p06.fused_mlp(x, w1, w2, save_preactivation=True),
    "fused-recompute": lambda x, w1, w2: p06.fused_mlp(x, w1, w2, save_preactivation=False),
    "fused-registers": p06.fused_mlp_in_registers,
    "gemm-silu": p06.gemm_silu_mlp,
    "padded-cublas": p06.padded_cublas_mlp,
}


def random_mlp(T, d_model, d_ff, n_out, dtype):
    x = torch.randn(T, d_model, device=DEVICE)
    w1 = torch.randn(d_ff, d_model, device=DEVICE) / d_model**0.5
    w2 = torch.randn(n_out, d_ff, device=DEVICE) / d_ff**0.5
    return [t.to(dtype) for t in (x, w1, w2)], torch.randn(T, n_out, device=DEVICE).to(dtype)


def check(fn, inputs, grad_out, tol):
    checks.check_against_float64(fn, baseline.mlp_eager, inputs, grad_out, tol, ["y", "dx", "dw1", "dw2"])


# d_ff = 300 is not a multiple of 16 (like 1365) and spans several hidden chunks, 160 outputs several
# output blocks (in the interpreter's config); T crosses row blocks at 1001.
# fp32 at every T; fp16 (slow in the interpreter, same code path) at the two small ones.
@pytest.mark.parametrize(
    ("dtype", "T"),
    [(torch.float32, 1), (torch.float32, 37), (torch.float32, 1001), (torch.float16, 1), (torch.float16, 37)],
)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_small_dims_match_float64(variant, dtype, T):
    inputs, grad_out = random_mlp(T, 32, 300, 160, dtype)
    check(VARIANTS[variant], inputs, grad_out, 1e-5 if dtype == torch.float32 else 5e-3)


def test_pad_hidden_adds_zeros_to_a_multiple_of_16():
    w1, w2 = torch.randn(300, 32), torch.randn(160, 300)
    w1p, w2p = p06.pad_hidden(w1, w2)
    assert w1p.shape == (304, 32) and w2p.shape == (160, 304)
    assert torch.equal(w1p[:300], w1) and torch.equal(w2p[:, :300], w2)
    assert not w1p[300:].any() and not w2p[:, 300:].any()
    aligned = torch.randn(320, 32), torch.randn(160, 320)
    assert all(a is b for a, b in zip(p06.pad_hidden(*aligned), aligned, strict=True))  # no copy


def test_real_weight_shapes():
    inputs, grad_out = random_mlp(3, 512, 1365, 512, torch.float32)
    check(p06.fused_mlp, inputs, grad_out, 1e-5)


def check_on_views(x, w1, w2, grad_out, tol):
    """fused_mlp on these very tensors (``check`` would clone them into fresh dense ones), against
    float64 eager on dense copies."""
    y = p06.fused_mlp(x, w1, w2)
    grads = torch.autograd.grad(y, [x, w1, w2], grad_out)
    dense = [t.detach().double().requires_grad_() for t in (x, w1, w2)]
    ref = baseline.mlp_eager(*dense)
    ref_grads = torch.autograd.grad(ref, dense, grad_out.double())
    for name, got, want in zip(["y", "dx", "dw1", "dw2"], [y, *grads], [ref, *ref_grads], strict=True):
        assert got.shape == want.shape and checks.rel(got, want) < tol, name


def test_strided_views_are_read_right():
    # Every second column of x and a transposed W2: the staged forward's TMA descriptors need unit
    # last strides, so such views are copied first; the values must not change.
    (x, w1, w2), grad_out = random_mlp(37, 64, 300, 160, torch.float32)
    x_view = x.requires_grad_()[:, ::2]
    w2_view = w2.t().contiguous().requires_grad_().t()
    assert x_view.stride(1) == 2 and w2_view.stride(1) != 1
    check_on_views(x_view, w1[:, :32].contiguous().requires_grad_(), w2_view, grad_out, 1e-5)


def test_misaligned_start_is_read_right():
    # A view one element into its storage starts 4 bytes past a 16-byte boundary: no TMA
    # descriptor can address it, so the forward copies it first.
    (x, w1, w2), grad_out = random_mlp(37, 32, 300, 160, torch.float32)
    storage = torch.cat([torch.zeros(1, device=DEVICE), x.flatten()]).requires_grad_()
    x_shifted = storage[1:].view(37, 32)
    assert x_shifted.data_ptr() % 16 != 0
    check_on_views(x_shifted, w1.requires_grad_(), w2.requires_grad_(), grad_out, 1e-5)


def test_batched_input_and_autocast_casts_weights():
    # The model passes (B, L, d) activations; under autocast, fp32 weights are cast as F.linear casts them.
    x = torch.randn(2, 9, 32, device=DEVICE)
    w1 = torch.randn(40, 32, device=DEVICE, requires_grad=True)
    w2 = torch.randn(32, 40, device=DEVICE, requires_grad=True)
    y_fused = checks.check_autocast_casts_weights(baseline.mlp_eager, p06.fused_mlp, x, w1, w2)
    assert y_fused.shape == (2, 9, 32)


def test_plugs_into_the_model():
    checks.check_plugs_into_the_model("mlp", baseline.mlp_eager, p06.fused_mlp, n_layers=2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((_t(5, 32), _t(40, 16), _t(32, 40)), "w1: expected \\(D_FF, 32\\)"),
        ((_t(5, 32), _t(40, 32), _t(32, 41)), "w2: expected \\(N_OUT, 40\\)"),
        ((_t(5, 32), _t(40, 32), _t(32, 40, 1)), "shapes"),
        ((_t(5, 32), _t(40, 32, dtype=torch.float16), _t(32, 40)), "dtypes"),
        ((_t(5, 32, dtype=torch.int32), _t(40, 32), _t(32, 40)), "x: dtype"),
        ((_t(5, 24), _t(40, 24), _t(24, 40)), "multiple of 16"),
        ((_t(0, 32), _t(40, 32), _t(32, 40)), "at least one token"),
        ((_t(5, 32, device="meta"), _t(40, 32), _t(32, 40)), "x: must be on"),
    ],
)
def test_bad_input_raises(args, message):
    with pytest.raises(ValueError, match=message):
        p06.fused_mlp(*args)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 37, 1001])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gpu_bf16_real_shapes_match_float64(variant, T):
    inputs, grad_out = random_mlp(T, 512, 1365, 512, torch.bfloat16)
    check(VARIANTS[variant], inputs, grad_out, 1.5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("save", [False, True])
def test_gpu_staged_forward_reuses_each_programs_scratch(save):
    # 20 011 rows are 157 row blocks of 128: more than one per program on a GPU of up to 156 SMs,
    # so programs overwrite their scratch, and the last block is partial.
    inputs, grad_out = random_mlp(20_011, 512, 1365, 512, torch.bfloat16)
    check(lambda x, w1, w2: p06.fused_mlp(x, w1, w2, save_preactivation=save), inputs, grad_out, 1.5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [37, 1001])
def test_gpu_fp16_staged_forward_matches_float64(T):
    # fp16 keeps 3 more mantissa bits than bf16: the staged forward's tanh.approx SiLU must stay
    # within fp16's tolerance too.
    inputs, grad_out = random_mlp(T, 512, 1365, 512, torch.float16)
    check(p06.fused_mlp, inputs, grad_out, 5e-3)
