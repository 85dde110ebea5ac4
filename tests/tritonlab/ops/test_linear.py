"""tritonlab.ops.linear: F.linear's results, with dW leaving the GEMM in the weight's dtype under autocast."""

import pytest
import torch
import torch.nn.functional as F

from tritonlab.ops.linear import linear
from tritonlab.testing import rel_err


def _leaves(*shapes, dtype=torch.float32, device="cpu"):
    torch.manual_seed(0)
    return [torch.randn(s, dtype=dtype, device=device, requires_grad=True) for s in shapes]


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 7, 13), (3, 129, 64)])
def test_under_cpu_autocast_it_matches_f_linear(shape):
    *lead, n_in = shape
    x, w = _leaves((*lead, n_in), (5, n_in))
    dy = torch.randn(*lead, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = linear(x, w)
        ref = F.linear(x, w)
    assert y.dtype == ref.dtype == torch.bfloat16 and torch.equal(y, ref)
    dx, dw = torch.autograd.grad(y, (x, w), dy.bfloat16())
    rdx, rdw = torch.autograd.grad(ref, (x, w), dy.bfloat16())
    assert dx.dtype == rdx.dtype == torch.float32 and dw.dtype == rdw.dtype == torch.float32
    assert torch.equal(dx, rdx) and torch.equal(dw, rdw)


def test_without_autocast_it_is_f_linear_in_float64():
    x, w = _leaves((4, 3, 11), (6, 11), dtype=torch.float64)
    y = linear(x, w)
    assert y.dtype == torch.float64 and torch.equal(y, F.linear(x, w))
    dy = torch.randn_like(y)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    assert rel_err(dx, dy @ w.detach()) < 1e-12
    assert rel_err(dw, dy.reshape(-1, 6).t() @ x.detach().reshape(-1, 11)) < 1e-12


def test_a_strided_input_and_no_input_gradient():
    x = torch.randn(11, 8).t()  # (8, 11), not contiguous
    w = torch.randn(3, 11, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = linear(x, w)
    (dw,) = torch.autograd.grad(y.float().sum(), (w,))
    ref = torch.ones(8, 3).t() @ x.bfloat16().float()
    assert dw.shape == w.shape and rel_err(dw, ref) < 1e-2


def test_bad_weight_shape_names_the_argument():
    with pytest.raises(ValueError, match="weight: expected \\(out_features, 4\\)"):
        linear(torch.randn(2, 4), torch.randn(3, 5))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 1), (37, 129), (4096, 1280)])
def test_gpu_dw_is_the_float32_sum_not_a_widened_bf16(shape):
    n, n_in = shape
    x, w = _leaves((n, n_in), (300, n_in), device="cuda")
    dy = torch.randn(n, 300, device="cuda").bfloat16()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = linear(x, w)
        ref = F.linear(x, w)
    assert torch.equal(y, ref)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    rdx, rdw = torch.autograd.grad(ref, (x, w), dy)
    exact = dy.double().t() @ x.detach().bfloat16().double()
    assert dw.dtype == torch.float32 and rel_err(dw, exact) < 1e-5  # float32 accumulation, stored as is
    assert rel_err(rdw, exact) < 1e-2  # autocast's: rounded to bf16
    assert dx.dtype == torch.float32 and rel_err(dx, rdx) < 1e-2
