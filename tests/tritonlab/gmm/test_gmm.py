"""tritonlab.gmm against a float64 reference: values, gradients, extremes, the model, bad input,
torch.compile through the custom ops, and float32 and Inductor in bf16 on the GPU."""

import math

import pytest
import torch

from tritonlab.gmm import GMMNLLLoss, gmm_nll
from tritonlab.testing import rel_err as rel
from tritonlab.testing import same_layout_leaf

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def reference_nll(params: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``tritonlab.models.gmm_nll``'s formula in float64."""
    logit, mu, log_sigma = params.double().unbind(-1)
    z = (y.double().reshape(-1, 1) - mu) * torch.exp(-log_sigma)
    log_normal = -0.5 * z * z - log_sigma - 0.5 * math.log(2 * math.pi)
    return -torch.logsumexp(torch.log_softmax(logit, -1) + log_normal, -1).mean()


def loss_and_grads(fn, params, y):
    params, y = same_layout_leaf(params), same_layout_leaf(y)
    loss = fn(params, y)
    d_params, d_y = torch.autograd.grad(loss, [params, y])
    return loss, d_params, d_y


def random_inputs(T, dtype, scale=1.0, K=10):
    params = (torch.randn(T, K, 3, device=DEVICE) * scale).to(dtype)
    return params, torch.randn(T, device=DEVICE) * scale


# 128 is a whole number of tiles; 1001 is not, and the forward's programs each walk several tiles.
@pytest.mark.parametrize("T", [1, 37, 128, 1001])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_float64(T, dtype):
    params, y = random_inputs(T, dtype)
    loss, d_params, d_y = loss_and_grads(gmm_nll, params, y)
    ref_loss, ref_d_params, ref_d_y = loss_and_grads(reference_nll, params.double(), y.double())
    assert loss.dtype == torch.float32 and d_params.dtype == dtype
    assert torch.isfinite(d_params).all()
    assert rel(loss, ref_loss) < 1e-5
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: the gradient is rounded once on the way out
    assert rel(d_params, ref_d_params) < tol
    assert rel(d_y, ref_d_y) < tol


def test_y_column_strided_params_and_other_k():
    # y as (T, 1); params a non-contiguous view; K = 5 components instead of 10.
    storage = torch.randn(53, 5, 4, device=DEVICE)
    params, y = storage[..., :3], torch.randn(53, 1, device=DEVICE)
    assert not params.is_contiguous() and not same_layout_leaf(params).is_contiguous()
    loss, d_params, _ = loss_and_grads(gmm_nll, params, y)
    ref_loss, ref_d_params, _ = loss_and_grads(reference_nll, params.double(), y.double())
    assert rel(loss, ref_loss) < 1e-5 and rel(d_params, ref_d_params) < 1e-5


@pytest.mark.parametrize("K", [1, 2, 11, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_widths(K, dtype):
    # A row's 3K values are padded, in registers only, to 4, 8, 64 and 256 columns.
    params, y = random_inputs(37, dtype, K=K)
    loss, d_params, d_y = loss_and_grads(gmm_nll, params, y)
    ref_loss, ref_d_params, ref_d_y = loss_and_grads(reference_nll, params.double(), y.double())
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel(loss, ref_loss) < 1e-5 and rel(d_params, ref_d_params) < tol and rel(d_y, ref_d_y) < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_finite_at_extremes(dtype):
    # |y - mu| up to 1e4 and log sigma in [-20, 20]: z reaches 4.9e12, z² 2.4e25 -- finite in fp32.
    T = 301
    params = torch.randn(T, 10, 3, device=DEVICE)
    params[..., 1] = torch.empty(T, 10, device=DEVICE).uniform_(-1e4, 1e4)
    params[..., 2] = torch.empty(T, 10, device=DEVICE).uniform_(-20, 20)
    params[:7, :, 2] = -20.0  # the worst corner, on purpose
    params = params.to(dtype)
    y = torch.zeros(T, device=DEVICE)
    y[:7] = 1e4
    loss, d_params, d_y = loss_and_grads(gmm_nll, params, y)
    ref_loss, ref_d_params, _ = loss_and_grads(reference_nll, params.double(), y.double())
    assert torch.isfinite(loss) and torch.isfinite(d_params).all() and torch.isfinite(d_y).all()
    assert rel(loss, ref_loss) < 1e-5
    if dtype == torch.float32:
        # In bf16 the rounded means and scales tie between components, and which of two tied
        # components takes the responsibility (and a 1e22 gradient) is decided by fp32 rounding of
        # log-densities near -1e25: ill-conditioned, so only finiteness and the loss are checked there.
        assert rel(d_params, ref_d_params) < 1e-5


def test_plugs_into_the_model(plugs_into_the_model):
    plugs_into_the_model("loss", gmm_nll, n_layers=1)


def test_module_is_gmm_nll():
    params, y = random_inputs(37, torch.float32)
    assert torch.equal(GMMNLLLoss()(params, y), gmm_nll(params, y))


@pytest.mark.parametrize(
    ("params", "y", "message"),
    [
        (torch.randn(4, 10, 2), torch.randn(4), "params: expected a \\(T, K, 3\\)"),
        (torch.randn(4, 10, 3, dtype=torch.float16), torch.randn(4), "params: dtype"),
        (torch.randn(4, 10, 3), torch.randn(5), "y: expected shape"),
        (torch.randn(4, 10, 3), torch.ones(4, dtype=torch.int64), "y: expected a floating-point"),
        (torch.randn(0, 10, 3), torch.randn(0), "params: needs T >= 1"),
        (torch.randn(4, 10, 3, device="meta"), torch.randn(4, device="meta"), "params: expected a tensor on"),
        # more values than 32-bit offsets reach, without the memory: a broadcast view
        (
            torch.zeros(1, 1, 1, device=DEVICE).expand(2**31 // 30 + 1, 10, 3),
            torch.zeros(1, device=DEVICE).expand(2**31 // 30 + 1),
            r"2\*\*31",
        ),
    ],
)
def test_bad_input_raises(params, y, message):
    if params.device.type != "meta":
        params, y = params.to(DEVICE), y.to(DEVICE)
    with pytest.raises(ValueError, match=message):
        gmm_nll(params, y)


# -- torch.compile: the custom ops -----------------------------------------------------------------


def _compiled_loss_and_grads(compiled_matches_eager, params, y, tol, backend="aot_eager"):
    """The compiled loss and its gradients (checked against eager), and the float64 reference's."""
    compiled = compiled_matches_eager(gmm_nll, (params, y), torch.tensor(0.7, device=DEVICE), tol, backend)
    return loss_and_grads(compiled, params, y), loss_and_grads(reference_nll, params.double(), y.double())


def test_compiled_matches_eager_and_float64(compiled_matches_eager):
    # A strided params view (its .contiguous() is traced) with K = 5, y as (T, 1), T = 53.
    params, y = torch.randn(53, 5, 4, device=DEVICE)[..., :3], torch.randn(53, 1, device=DEVICE)
    got, ref = _compiled_loss_and_grads(compiled_matches_eager, params, y, 1e-6)
    for g, r in zip(got, ref, strict=True):
        assert rel(g, r) < 1e-5


def test_custom_ops_fake_matches_real(custom_op_checks):
    params, y = random_inputs(37, torch.float32)
    custom_op_checks(torch.ops.tritonlab.gmm_nll_forward, params.clone().requires_grad_(), y.requires_grad_())
    grad_loss = torch.tensor(0.7, device=DEVICE)
    custom_op_checks(torch.ops.tritonlab.gmm_nll_backward, params, y.detach(), grad_loss)


@pytest.mark.gpu
def test_gpu_inductor_bf16_matches_eager_and_float64(compiled_matches_eager):
    params, y = random_inputs(32_000, torch.bfloat16, scale=3.0)
    (loss, d_params, _), (ref_loss, ref_d_params, _) = _compiled_loss_and_grads(
        compiled_matches_eager, params, y, 1e-3, "inductor"
    )
    assert rel(loss, ref_loss) < 1e-5 and rel(d_params, ref_d_params) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 37, 1001, 32_000])
def test_gpu_bf16_matches_float64_and_is_deterministic(T):
    params, y = random_inputs(T, torch.bfloat16, scale=3.0)
    loss, d_params, d_y = loss_and_grads(gmm_nll, params, y)
    again = loss_and_grads(gmm_nll, params, y)
    ref_loss, ref_d_params, _ = loss_and_grads(reference_nll, params.double(), y.double())
    assert rel(loss, ref_loss) < 1e-5 and rel(d_params, ref_d_params) < 1e-2
    assert torch.equal(loss, again[0]) and torch.equal(d_params, again[1])  # same bits every run


# The loss runs on the B·N target rows: 4 000 at the TransformerNP's mid shape, 32 000 at small.
@pytest.mark.gpu
@pytest.mark.parametrize("T", [4_000, 32_000])
def test_gpu_float32_at_the_models_shapes_matches_float64(T):
    params, y = random_inputs(T, torch.float32, scale=3.0)
    loss, d_params, d_y = loss_and_grads(gmm_nll, params, y)
    ref_loss, ref_d_params, ref_d_y = loss_and_grads(reference_nll, params.double(), y.double())
    assert rel(loss, ref_loss) < 1e-5 and rel(d_params, ref_d_params) < 1e-5 and rel(d_y, ref_d_y) < 1e-5
