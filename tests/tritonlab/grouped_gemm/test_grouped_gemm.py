"""tritonlab.grouped_gemm against a float64 reference: values, gradients, the model, bad input,
torch.compile through the custom ops, and float32 and Inductor in bf16 on the GPU."""

import pytest
import torch

from tritonlab.grouped_gemm import GMMHeads, gmm_heads, gmm_heads_bmm
from tritonlab.models import gmm_heads_loop
from tritonlab.testing import check_against_float64, rel_err
from tritonlab.tuning import ConfigRecord

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _t(*shape, dtype=torch.float32, device=None):
    return torch.randn(*shape, device=device or DEVICE).to(dtype)


def random_heads(T, n_heads, d_model, d_hidden, dtype):
    z = torch.randn(T, d_model, device=DEVICE)
    w1 = torch.randn(n_heads, d_hidden, d_model, device=DEVICE) / d_model**0.5
    w2 = torch.randn(n_heads, 3, d_hidden, device=DEVICE) / d_hidden**0.5
    return [t.to(dtype) for t in (z, w1, w2)], torch.randn(T, n_heads, 3, device=DEVICE).to(dtype)


def check(fn, inputs, grad_out, tol):
    return check_against_float64(fn, gmm_heads_loop, inputs, grad_out, tol, ["out", "dz", "dw1", "dw2"])


# fp32 at every T; fp16 (slow in the interpreter, same code path) at the two small ones.
@pytest.mark.parametrize(
    ("dtype", "T"),
    [(torch.float32, 1), (torch.float32, 37), (torch.float32, 1001), (torch.float16, 1), (torch.float16, 37)],
)
def test_small_dims_match_float64(dtype, T):
    # d_hidden = 300 is not a multiple of 16 (like 1365) and spans two hidden chunks in the
    # interpreter's config; 3 heads exercise the group axis; T crosses row blocks at 1001.
    inputs, grad_out = random_heads(T, 3, 32, 300, dtype)
    check(gmm_heads, inputs, grad_out, 1e-5 if dtype == torch.float32 else 5e-3)


@pytest.mark.parametrize("T", [1, 37])
def test_saved_preactivation_matches_float64(T):
    # The backward reads the pre-activation the forward kept (3 heads: the group stride of a).
    inputs, grad_out = random_heads(T, 3, 32, 300, torch.float32)
    check(lambda z, w1, w2: gmm_heads(z, w1, w2, save_preactivation=True), inputs, grad_out, 1e-5)


def test_real_weight_shapes():
    inputs, grad_out = random_heads(1, 10, 512, 1365, torch.float32)
    check(gmm_heads, inputs, grad_out, 1e-5)


def test_bmm_baseline_matches():
    inputs, grad_out = random_heads(37, 3, 32, 100, torch.float32)
    check(gmm_heads_bmm, inputs, grad_out, 1e-5)


def test_plugs_into_the_model(plugs_into_the_model):
    plugs_into_the_model("heads", gmm_heads, n_layers=1)


def test_autocast_casts_weights(autocast_casts_weights):
    z = torch.randn(11, 32, device=DEVICE)
    w1 = torch.randn(3, 40, 32, device=DEVICE, requires_grad=True)
    w2 = torch.randn(3, 3, 40, device=DEVICE, requires_grad=True)
    autocast_casts_weights(gmm_heads_loop, gmm_heads, z, w1, w2)


def test_record_names_the_forward_and_backward_tiles():
    (z, w1, w2), grad_out = random_heads(5, 2, 32, 40, torch.float32)
    z.requires_grad_()
    record = ConfigRecord()
    torch.autograd.grad(gmm_heads(z, w1, w2, record=record), z, grad_out)
    assert set(record.picked) == {"heads_fwd", "heads_hidden_bwd"}


def test_module_is_gmm_heads_on_its_weights():
    module = GMMHeads(3, 32, 40, device=DEVICE)
    z = torch.randn(5, 32, device=DEVICE)
    assert module(z).shape == (5, 3, 3)
    assert rel_err(module(z), gmm_heads_loop(z, module.w1, module.w2)) < 1e-5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((_t(5, 32), _t(3, 40, 16), _t(3, 3, 40)), "w1: expected \\(G, F, 32\\)"),
        ((_t(5, 32), _t(3, 40, 32), _t(2, 3, 40)), "w2: expected \\(3, N_OUT, 40\\)"),
        ((_t(5, 32), _t(3, 40, 32), _t(3, 17, 40)), "at most 16 outputs"),
        ((_t(5, 32, 1), _t(3, 40, 32), _t(3, 3, 40)), "shapes"),
        ((_t(5, 32), _t(3, 40, 32, dtype=torch.float16), _t(3, 3, 40)), "dtypes"),
        ((_t(5, 32), _t(3, 40, 32, dtype=torch.int64), _t(3, 3, 40)), "w1: unsupported dtype"),
        ((_t(5, 24), _t(3, 40, 24), _t(3, 3, 40)), "multiple of 16"),
        ((_t(0, 32), _t(3, 40, 32), _t(3, 3, 40)), "z: expected at least one row"),
        ((_t(5, 32), _t(3, 40, 32), _t(3, 3, 40, device="meta")), "w2: expected a tensor on"),
    ],
)
def test_bad_input_raises(args, message):
    with pytest.raises(ValueError, match=message):
        gmm_heads(*args)


# -- torch.compile: the custom ops -----------------------------------------------------------------


@pytest.mark.parametrize("save", [False, True])
def test_compiled_matches_eager_and_float64(save, compiled_matches_eager):
    # 3 heads of d_hidden = 40, padded to 48 around the op (traced, as the weights' casts).
    inputs, grad_out = random_heads(13, 3, 32, 40, torch.float32)
    fn = lambda z, w1, w2: gmm_heads(z, w1, w2, save_preactivation=save)  # noqa: E731
    check(compiled_matches_eager(fn, inputs, grad_out, 1e-6), inputs, grad_out, 1e-5)


@pytest.mark.parametrize("save", [False, True])
def test_custom_ops_fake_matches_real(save, custom_op_checks):
    # The ops take padded weights (d_hidden a multiple of 16); the upstream gradient strided.
    (z, w1, w2), _ = random_heads(13, 3, 32, 48, torch.float32)
    dout = torch.randn(3, 3, 13, device=DEVICE).permute(2, 0, 1)
    leaves = [t.clone().requires_grad_() for t in (z, w1, w2)]
    custom_op_checks(torch.ops.tritonlab.gmm_heads_forward, *leaves, save)
    _, a = torch.ops.tritonlab.gmm_heads_forward(z, w1, w2, save)
    custom_op_checks(torch.ops.tritonlab.gmm_heads_backward, z, w1, w2, a if save else None, dout)


def test_a_record_is_refused_under_compile():
    (z, w1, w2), _ = random_heads(5, 2, 32, 40, torch.float32)
    record = ConfigRecord()
    compiled = torch.compile(lambda *zw: gmm_heads(*zw, record=record), fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="record: gmm_heads cannot fill a ConfigRecord under torch.compile"):
        compiled(z, w1, w2)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 37, 1001])
@pytest.mark.parametrize("save", [False, True])
def test_gpu_bf16_real_shapes_match_float64(T, save):
    inputs, grad_out = random_heads(T, 10, 512, 1365, torch.bfloat16)
    check(lambda z, w1, w2: gmm_heads(z, w1, w2, save_preactivation=save), inputs, grad_out, 1.5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("save", [False, True])
def test_gpu_inductor_bf16_matches_eager_and_float64(save, compiled_matches_eager):
    inputs, grad_out = random_heads(1001, 10, 512, 1365, torch.bfloat16)
    fn = lambda z, w1, w2: gmm_heads(z, w1, w2, save_preactivation=save)  # noqa: E731
    check(compiled_matches_eager(fn, inputs, grad_out, 1e-3, "inductor"), inputs, grad_out, 1.5e-2)


# The heads run on the B·N target rows: 4 000 at the TransformerNP's mid shape, 32 000 at small.
@pytest.mark.gpu
@pytest.mark.parametrize("T", [4_000, 32_000])
@pytest.mark.parametrize("save", [False, True])
def test_gpu_float32_at_the_models_shapes_matches_float64(T, save, float32_matmul_precision):
    # Under the default "highest" precision every dot is IEEE float32 (TF32 products read 1.6e-3).
    float32_matmul_precision("highest")
    inputs, grad_out = random_heads(T, 10, 512, 1365, torch.float32)
    check(lambda z, w1, w2: gmm_heads(z, w1, w2, save_preactivation=save), inputs, grad_out, 5e-5)


@pytest.mark.gpu
def test_gpu_float32_under_high_precision_runs_tf32(float32_matmul_precision):
    float32_matmul_precision("high")  # TF32 allowed: the error may grow to TF32's, nothing may crash
    inputs, grad_out = random_heads(4_000, 10, 512, 1365, torch.float32)
    check(gmm_heads, inputs, grad_out, 2e-2)
