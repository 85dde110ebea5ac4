"""tritonlab.ops.linear: F.linear's results, with dW leaving the GEMM in the weight's dtype under autocast."""

import pytest
import torch
import torch.nn.functional as F

from tritonlab.ops.linear import linear, linears
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


@pytest.mark.parametrize("outs", [(5,), (3, 4, 6)])
def test_linears_sharing_x_match_separate_f_linear_in_float64(outs):
    x, *ws = _leaves((2, 9, 13), *((n, 13) for n in outs), dtype=torch.float64)
    ys = linears(x, ws)
    refs = [F.linear(x, w) for w in ws]
    assert len(ys) == len(outs) and all(torch.equal(y, r) for y, r in zip(ys, refs, strict=True))
    dys = [torch.randn_like(r) for r in refs]
    grads = torch.autograd.grad(ys, (x, *ws), dys)
    ref_grads = torch.autograd.grad(refs, (x, *ws), dys)
    assert all(rel_err(g, r) < 1e-12 for g, r in zip(grads, ref_grads, strict=True))


def test_linears_under_cpu_autocast_sum_dx_in_the_gemms():
    x, wq, wk, wv = _leaves((3, 17, 32), (32, 32), (32, 32), (48, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ys = linears(x, (wq, wk, wv))
        refs = [F.linear(x, w) for w in (wq, wk, wv)]
    assert all(y.dtype == torch.bfloat16 and torch.equal(y, r) for y, r in zip(ys, refs, strict=True))
    dys = [torch.randn_like(r) for r in refs]
    dx, *dws = torch.autograd.grad(ys, (x, wq, wk, wv), dys)
    rdx, *rdws = torch.autograd.grad(refs, (x, wq, wk, wv), dys)
    assert dx.dtype == torch.float32 and all(d.dtype == torch.float32 for d in dws)
    assert all(torch.equal(d, r) for d, r in zip(dws, rdws, strict=True))
    # dx: one bf16 accumulator through the GEMMs against three bf16 results summed in float32
    exact = sum(dy.double() @ w.detach().bfloat16().double() for dy, w in zip(dys, (wq, wk, wv), strict=True))
    assert rel_err(dx, exact) < 1e-2 and rel_err(rdx, exact) < 1e-2


def test_linears_checks_every_weight():
    with pytest.raises(ValueError, match="weights: expected at least one"):
        linears(torch.randn(2, 4), ())
    with pytest.raises(ValueError, match="weights\\[1\\]: expected \\(out_features, 4\\)"):
        linears(torch.randn(2, 4), (torch.randn(3, 4), torch.randn(3, 5)))


@pytest.mark.gpu
def test_gpu_linears_under_autocast_against_float64():
    x, wq, wk, wv = _leaves((4096, 1280), (1280, 1280), (1280, 1280), (640, 1280), device="cuda")
    dys = [torch.randn(4096, n, device="cuda").bfloat16() for n in (1280, 1280, 640)]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ys = linears(x, (wq, wk, wv))
    dx, *dws = torch.autograd.grad(ys, (x, wq, wk, wv), dys)
    x16 = x.detach().bfloat16().double()
    for dy, dw in zip(dys, dws, strict=True):
        assert dw.dtype == torch.float32 and rel_err(dw, dy.double().t() @ x16) < 1e-5
    exact = sum(dy.double() @ w.detach().bfloat16().double() for dy, w in zip(dys, (wq, wk, wv), strict=True))
    assert dx.dtype == torch.float32 and rel_err(dx, exact) < 1e-2


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
