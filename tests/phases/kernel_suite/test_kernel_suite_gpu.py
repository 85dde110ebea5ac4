"""Kernel suite on the GPU in bf16 against float64 references (computed on the CPU).

Tolerances: bf16 keeps 8 significant bits, so each stored output or gradient element carries up to
2**-9 = 2e-3 relative rounding error; norm-wise the error stays below that, and 5e-3 leaves room for
the GPU's approximate exp/erf/rsqrt. The cross-entropy loss is fp32 computed from the same bf16
logits as the reference, so it is held to 1e-4.
"""

import pytest
import torch
import torch.nn.functional as F

import common  # noqa: F401
from phases.kernel_suite import cross_entropy, gelu, quantize_fp8, rms_norm, rope, rope_cache, swiglu

pytestmark = pytest.mark.gpu
BF16_TOL = 5e-3


def bf16_leaf(*shape, scale=1.0):
    return (scale * torch.randn(*shape, device="cuda")).to(torch.bfloat16).requires_grad_()


def cpu64(t):
    return t.detach().cpu().double().requires_grad_()


@pytest.mark.parametrize("shape", [(1, 1), (5, 4097), (4096, 1024), (3, 65536)])
def test_rms_norm_bf16(shape, rel_err):
    x, w = bf16_leaf(*shape), bf16_leaf(shape[-1])
    y = rms_norm(x, w)
    dy = torch.randn(shape, device="cuda").bfloat16()
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    xr, wr = cpu64(x), cpu64(w)
    yr = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6) * wr
    dxr, dwr = torch.autograd.grad(yr, (xr, wr), dy.cpu().double())
    # dx's terms cancel exactly at width 1: measure its error against their size there.
    dx_terms = (
        (dy.cpu().double() * wr.detach() / xr.detach().pow(2).mean(-1, keepdim=True).sqrt()).norm().item()
    )
    assert rel_err(y, yr) < BF16_TOL and rel_err(dw, dwr) < BF16_TOL
    assert rel_err(dx, dxr, scale=dx_terms) < BF16_TOL


@pytest.mark.parametrize("shape", [(7, 123), (64, 8192)])
def test_gelu_swiglu_bf16(shape, rel_err):
    for approximate in ("none", "tanh"):
        x = bf16_leaf(*shape, scale=3.0)
        y = gelu(x, approximate)
        y.sum().backward()
        xr = cpu64(x)
        yr = F.gelu(xr, approximate=approximate)
        yr.sum().backward()
        assert rel_err(y, yr) < BF16_TOL and rel_err(x.grad, xr.grad) < BF16_TOL
    gate, up = bf16_leaf(*shape, scale=3.0), bf16_leaf(*shape)
    y = swiglu(gate, up)
    dy = torch.randn(shape, device="cuda").bfloat16()
    dg, du = torch.autograd.grad(y, (gate, up), dy)
    gr, ur = cpu64(gate), cpu64(up)
    yr = F.silu(gr) * ur
    dgr, dur = torch.autograd.grad(yr, (gr, ur), dy.cpu().double())
    for got, ref in ((y, yr), (dg, dgr), (du, dur)):
        assert rel_err(got, ref) < BF16_TOL


def test_rope_bf16_fused_qkv_views(rel_err):
    batch, seq, heads, d = 2, 300, 32, 128
    qkv = bf16_leaf(batch, seq, 3, heads, d)
    q, k = qkv[:, :, 0], qkv[:, :, 1, :8]  # strided q; k with 8 heads (grouped-query attention)
    cos, sin = rope_cache(seq, d)
    qo, ko = rope(q, k, cos, sin)
    dq_out, dk_out = torch.randn_like(qo), torch.randn_like(ko)
    torch.autograd.backward((qo, ko), (dq_out, dk_out))
    ref = cpu64(qkv)
    c, s = cos.cpu().double()[None, :, None, :], sin.cpu().double()[None, :, None, :]

    def rot(x):
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    qr, kr = rot(ref[:, :, 0]), rot(ref[:, :, 1, :8])
    torch.autograd.backward((qr, kr), (dq_out.cpu().double(), dk_out.cpu().double()))
    assert rel_err(qo, qr) < BF16_TOL and rel_err(ko, kr) < BF16_TOL
    assert rel_err(qkv.grad, ref.grad) < BF16_TOL


@pytest.mark.parametrize("vocab", [5, 123, 40961, 128256])
def test_cross_entropy_bf16(vocab, rel_err):
    rows = 64
    logits = bf16_leaf(rows, vocab, scale=4.0)
    target = torch.randint(0, vocab, (rows,), device="cuda")
    target[::7] = -100
    loss = cross_entropy(logits, target)
    (2.5 * loss).backward()  # an upstream gradient other than 1
    ref = cpu64(logits)
    loss_ref = F.cross_entropy(ref, target.cpu())
    (2.5 * loss_ref).backward()
    assert rel_err(loss, loss_ref) < 1e-4
    assert rel_err(logits.grad, ref.grad) < BF16_TOL


def test_cross_entropy_offsets_past_2_pow_31(rel_err):
    rows, vocab = 16800, 128256  # 2.15e9 logits: row * vocab overflows int32 in the last rows
    assert rows * vocab > 2**31
    logits = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16).requires_grad_()
    target = torch.randint(0, vocab, (rows,), device="cuda")
    loss = cross_entropy(logits, target, reduction="none")
    (grad,) = torch.autograd.grad(loss.sum(), logits)
    tail = logits.detach()[-4:].double()
    lse = torch.logsumexp(tail, -1)
    loss_ref = lse - tail.gather(1, target[-4:, None])[:, 0]
    grad_ref = torch.softmax(tail, -1)
    grad_ref[torch.arange(4), target[-4:]] -= 1
    assert rel_err(loss[-4:], loss_ref) < 1e-4
    assert rel_err(grad[-4:], grad_ref) < BF16_TOL


@pytest.mark.parametrize("granularity", ["row", "block"])
@pytest.mark.parametrize("shape", [(5, 4097), (64, 8192)])
def test_quantize_fp8_bf16_rounds_to_nearest(granularity, shape):
    x = (5 * torch.randn(shape, device="cuda")).bfloat16()
    q, scales = quantize_fp8(x, granularity)
    width = shape[1] if granularity == "row" else 128
    per_element = scales.repeat_interleave(width, -1)[:, : shape[1]]
    quotient = (x.float() * (1 / per_element)).clamp(-448, 448)
    same_bits = (
        (q.view(torch.uint8) == quotient.to(torch.float8_e4m3fn).view(torch.uint8)).float().mean().item()
    )
    exponent = torch.floor(torch.log2(quotient.double().abs().clamp_min(2.0**-6)))
    half_ulp = torch.exp2(exponent - 4)
    # Half an ulp, plus the 1e-7 relative difference between the GPU's 1/scale and PyTorch's.
    assert torch.all((q.double() - quotient.double()).abs() <= half_ulp + 1e-6 * quotient.double().abs())
    assert same_bits > 0.999


def test_cross_entropy_out_of_range_target_raises_on_gpu():
    # The count reaches the host through page-locked memory behind the stats kernel (no full sync).
    logits = bf16_leaf(5, 300)
    with pytest.raises(ValueError, match="target: value 300"):
        cross_entropy(logits, torch.tensor([1, 2, 300, 4, -100], device="cuda"))
    loss = cross_entropy(logits, torch.tensor([1, 2, 3, 4, -100], device="cuda"))  # and it goes on
    assert torch.isfinite(loss)
