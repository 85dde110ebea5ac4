"""tritonlab.ops on the GPU: bf16 and float32 against float64 references.

Tolerances: bf16 keeps 8 significant bits, so each stored output or gradient element carries up to
2**-9 = 2e-3 relative rounding error; norm-wise the error stays below that, and 5e-3 leaves room for
the GPU's approximate exp/erf/rsqrt. The cross-entropy loss is accumulated in fp32 and returned in
the logits' dtype (like F.cross_entropy), so a bf16 loss carries bf16's rounding: BF16_TOL too.

float32 (the benchmark's sizes, or a slice where the float64 copies would be large): every op keeps
float32 inside, so norm-wise errors stay within a few units of 2**-24 times the square root of the
reduction length; 1e-5 holds for rows and element-wise ops, 5e-5 for the cross-entropy's 128 256-long
sums of the GPU's approximate exp. None of these kernels has a ``tl.dot``, so PyTorch's float32
matmul precision must change nothing.
"""

import pytest
import torch
import torch.nn.functional as F

from tritonlab.ops import (
    add_rms_norm,
    cross_entropy,
    geglu,
    gelu,
    quantize_fp8,
    rms_norm,
    rope,
    rope_cache,
    swiglu,
)
from tritonlab.testing import rel_err

pytestmark = pytest.mark.gpu
BF16_TOL = 5e-3


def bf16_leaf(*shape, scale=1.0):
    return (scale * torch.randn(*shape, device="cuda")).to(torch.bfloat16).requires_grad_()


def cpu64(t):
    return t.detach().cpu().double().requires_grad_()


@pytest.mark.parametrize("shape", [(1, 1), (5, 4097), (4096, 1600)])
def test_rms_norm_bf16_out_of_float32_is_rounded_once_to_nearest(shape):
    # the LM under autocast: a float32 residual in, the next matmul's bf16 out, rounded once to
    # nearest (bf16's unit roundoff 2**-8; truncation, as in the interpreter, would be 2**-7). Not
    # bit-equal to casting the float32 kernel's y: the two builds may sum a row in another order.
    x = torch.randn(shape, device="cuda", requires_grad=True)
    w = torch.randn(shape[-1], device="cuda", requires_grad=True)
    y = rms_norm(x, w, out_dtype=torch.bfloat16)
    x64, w64 = x.detach().double(), w.detach().double()
    ref = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64
    assert y.dtype == torch.bfloat16
    assert ((y.double() - ref).abs() <= (2**-8 + 1e-5) * ref.abs()).all()
    dy = torch.randn(shape, device="cuda").bfloat16()
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    ref_dx, ref_dw = torch.autograd.grad(rms_norm(x, w), (x, w), dy.float())
    assert dx.dtype == dw.dtype == torch.float32
    assert rel_err(dx, ref_dx) < 1e-6 and rel_err(dw, ref_dw) < 1e-6


@pytest.mark.parametrize("shape", [(1, 1), (5, 4097), (4096, 1024), (3, 65536)])
def test_rms_norm_bf16(shape):
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
def test_gelu_swiglu_bf16(shape):
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


def test_rope_bf16_fused_qkv_views():
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
def test_cross_entropy_bf16(vocab):
    rows = 64
    logits = bf16_leaf(rows, vocab, scale=4.0)
    target = torch.randint(0, vocab, (rows,), device="cuda")
    target[::7] = -100
    loss = cross_entropy(logits, target)
    (2.5 * loss).backward()  # an upstream gradient other than 1
    ref = cpu64(logits)
    loss_ref = F.cross_entropy(ref, target.cpu())
    (2.5 * loss_ref).backward()
    assert loss.dtype == torch.bfloat16 and rel_err(loss, loss_ref) < BF16_TOL
    assert rel_err(logits.grad, ref.grad) < BF16_TOL


def test_cross_entropy_offsets_past_2_pow_31():
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
    assert rel_err(loss[-4:], loss_ref) < BF16_TOL
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


# ------------------------------------------------------------------------------------------- float32
FP32_TOL = 1e-5
CE_FP32_TOL = 5e-5


def fp32_leaf(*shape, scale=1.0):
    return (scale * torch.randn(*shape, device="cuda")).requires_grad_()


def gpu64(t):
    return t.detach().double().requires_grad_()


def _rms_norm_fp32(shape):
    x, w = fp32_leaf(*shape), (1 + 0.1 * torch.randn(shape[-1], device="cuda")).requires_grad_()
    dy = torch.randn(shape, device="cuda")
    dx, dw = torch.autograd.grad(rms_norm(x, w), (x, w), dy)
    xr, wr = gpu64(x), gpu64(w)
    yr = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6) * wr
    dxr, dwr = torch.autograd.grad(yr, (xr, wr), dy.double())
    return {"y": (rms_norm(x, w), yr), "dx": (dx, dxr), "dw": (dw, dwr)}


@pytest.mark.parametrize("shape", [(16384, 4096), (4096, 1024), (3, 65536), (32768, 8192)])
def test_rms_norm_fp32_matches_float64(shape):
    for name, (got, ref) in _rms_norm_fp32(shape).items():
        assert got.dtype == torch.float32, name
        assert rel_err(got, ref) < FP32_TOL, name


def _add_rms_norm_case(shape, x_dtype, r_dtype, out_dtype):
    """add_rms_norm's s, y and gradients (x, residual, weight; ds and dy both flowing back) with the
    float64 references of the same inputs, and the size of g's terms (they cancel at width 1)."""
    x = torch.randn(shape, device="cuda").to(x_dtype).requires_grad_()
    r = (0.5 * torch.randn(shape, device="cuda")).to(r_dtype).requires_grad_()
    w = (1 + 0.3 * torch.randn(shape[-1], device="cuda")).to(x_dtype).requires_grad_()
    s, y = add_rms_norm(x, r, w, out_dtype=out_dtype)
    dy = torch.randn(shape, device="cuda").to(y.dtype)
    ds = torch.randn(shape, device="cuda").to(x_dtype)
    grads = torch.autograd.grad((s, y), (x, r, w), (ds, dy))
    xr, rr, wr = gpu64(x), gpu64(r), gpu64(w)
    sr = xr + rr
    rstd = torch.rsqrt(sr.pow(2).mean(-1, keepdim=True) + 1e-6)
    yr = sr * rstd * wr
    refs = torch.autograd.grad((sr, yr), (xr, rr, wr), (ds.double(), dy.double()))
    terms = (dy.double() * wr.detach() * rstd.detach()).norm().item() + ds.double().norm().item()
    return (s, y, *grads), (sr, yr, *refs), terms


@pytest.mark.parametrize("shape", [(1, 1), (5, 4097), (4096, 1280), (3, 65536)])
def test_add_rms_norm_bf16(shape):
    (s, y, gx, gr, gw), (sr, yr, gxr, grr, gwr), terms = _add_rms_norm_case(
        shape, torch.bfloat16, torch.bfloat16, None
    )
    assert s.dtype == y.dtype == gx.dtype == gr.dtype == gw.dtype == torch.bfloat16
    assert torch.equal(s, sr.detach().float().bfloat16())  # one fp32 add (exact here), rounded once
    assert rel_err(y, yr) < BF16_TOL and rel_err(gw, gwr) < BF16_TOL
    assert rel_err(gx, gxr, scale=terms) < BF16_TOL and gx.data_ptr() == gr.data_ptr()


@pytest.mark.parametrize("shape", [(1, 1), (5, 4097), (4096, 1280), (3, 65536)])
def test_add_rms_norm_fp32_stream_bf16_branch_bf16_out(shape):
    # The LM under autocast: the float32 residual stream plus a bf16 branch output; y in bf16 for the
    # next matmul, rounded once to nearest from the norm of the float32 sum; x's gradient in float32,
    # the branch's the same values rounded to bf16.
    (s, y, gx, gr, gw), (sr, yr, gxr, grr, gwr), terms = _add_rms_norm_case(
        shape, torch.float32, torch.bfloat16, torch.bfloat16
    )
    assert s.dtype == gx.dtype == gw.dtype == torch.float32 and y.dtype == gr.dtype == torch.bfloat16
    assert rel_err(s, sr) < FP32_TOL
    assert ((y.double() - yr).abs() <= (2**-8 + 1e-5) * yr.abs()).all()
    assert rel_err(gx, gxr, scale=terms) < FP32_TOL and rel_err(gw, gwr) < FP32_TOL
    assert torch.equal(gr, gx.bfloat16()) and rel_err(gr, grr, scale=terms) < BF16_TOL


@pytest.mark.parametrize("shape", [(8192, 4096), (4096, 1024)])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_fp32_matches_float64(shape, approximate):
    x = fp32_leaf(*shape, scale=3.0)
    dy = torch.randn(shape, device="cuda")
    y = gelu(x, approximate)
    (dx,) = torch.autograd.grad(y, x, dy)
    xr = gpu64(x)
    yr = F.gelu(xr, approximate=approximate)
    (dxr,) = torch.autograd.grad(yr, xr, dy.double())
    # the left tail: 1 + erf(z) is off by fp32's absolute error there, measured against 1% of ||x||
    assert rel_err(y, yr, scale=0.01 * x.norm().item()) < FP32_TOL
    assert rel_err(dx, dxr, scale=0.01 * dy.norm().item()) < FP32_TOL


@pytest.mark.parametrize("shape", [(8192, 4096), (4096, 1024)])
def test_swiglu_fp32_matches_float64(shape):
    gate, up = fp32_leaf(*shape, scale=3.0), fp32_leaf(*shape)
    dy = torch.randn(shape, device="cuda")
    y = swiglu(gate, up)
    dg, du = torch.autograd.grad(y, (gate, up), dy)
    gr, ur = gpu64(gate), gpu64(up)
    yr = F.silu(gr) * ur
    dgr, dur = torch.autograd.grad(yr, (gr, ur), dy.double())
    for got, ref in ((y, yr), (dg, dgr), (du, dur)):
        assert got.dtype == torch.float32 and rel_err(got, ref) < FP32_TOL


@pytest.mark.parametrize("tokens,heads", [(8192, 32), (4096, 8)])
def test_rope_fp32_matches_float64(tokens, heads):
    d, seq = 128, min(tokens, 4096)
    batch = tokens // seq
    q, k = fp32_leaf(batch, seq, heads, d), fp32_leaf(batch, seq, max(1, heads // 4), d)
    cos, sin = rope_cache(seq, d)
    qo, ko = rope(q, k, cos, sin)
    dq_out, dk_out = torch.randn_like(qo), torch.randn_like(ko)
    dq, dk = torch.autograd.grad((qo, ko), (q, k), (dq_out, dk_out))
    c, s = cos.double()[None, :, None, :], sin.double()[None, :, None, :]

    def rot(x):
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    qr, kr = gpu64(q), gpu64(k)
    qor, kor = rot(qr), rot(kr)
    dqr, dkr = torch.autograd.grad((qor, kor), (qr, kr), (dq_out.double(), dk_out.double()))
    for got, ref in ((qo, qor), (ko, kor), (dq, dqr), (dk, dkr)):
        assert got.dtype == torch.float32 and rel_err(got, ref) < FP32_TOL


@pytest.mark.parametrize("rows,vocab", [(4096, 32000), (1024, 128256), (16384, 32000)])
def test_cross_entropy_fp32_matches_float64(rows, vocab):
    logits = fp32_leaf(rows, vocab, scale=4.0)
    target = torch.randint(0, vocab, (rows,), device="cuda")
    target[::97] = -100
    loss = cross_entropy(logits, target)
    (grad,) = torch.autograd.grad(2.5 * loss, logits)
    lr = gpu64(logits)
    loss_ref = F.cross_entropy(lr, target)
    (gref,) = torch.autograd.grad(2.5 * loss_ref, lr)
    assert loss.dtype == torch.float32 and grad.dtype == torch.float32
    assert rel_err(loss, loss_ref) < CE_FP32_TOL and rel_err(grad, gref) < CE_FP32_TOL


@pytest.mark.parametrize("granularity", ["row", "block"])
@pytest.mark.parametrize("shape", [(8192, 4096), (4096, 1024)])
def test_quantize_fp8_from_fp32_is_torchs_rounding(granularity, shape):
    x = 5 * torch.randn(shape, device="cuda")
    q, scales = quantize_fp8(x, granularity)
    width = shape[1] if granularity == "row" else 128
    groups = x.view(shape[0], -1, width).double()
    expected = groups.abs().amax(-1) / 448
    assert rel_err(scales, expected.view(scales.shape)) < 2e-7
    quotient = (x * (1 / scales).repeat_interleave(width, -1)).clamp(-448, 448)
    same = (q.view(torch.uint8) == quotient.to(torch.float8_e4m3fn).view(torch.uint8)).float().mean().item()
    assert same > 0.999  # the GPU's 1/scale may differ from PyTorch's in the last bit


def test_tf32_allowed_by_torch_changes_nothing_here():
    """torch.set_float32_matmul_precision("high") is honoured: these kernels have no dots, so the
    float32 results are the same bits under either setting, and nothing fails."""
    previous = torch.get_float32_matmul_precision()
    torch.manual_seed(0)
    highest = {k: g.detach().clone() for k, (g, _) in _rms_norm_fp32((1024, 4096)).items()}
    logits = torch.randn(256, 32000, device="cuda")
    target = torch.randint(0, 32000, (256,), device="cuda")
    ce_highest = cross_entropy(logits, target)
    try:
        torch.set_float32_matmul_precision("high")
        torch.manual_seed(0)
        high = _rms_norm_fp32((1024, 4096))
        ce_high = cross_entropy(logits, target)
    finally:
        torch.set_float32_matmul_precision(previous)
    for name, (got, ref) in high.items():
        assert torch.equal(got, highest[name]), name
        assert rel_err(got, ref) < FP32_TOL, name
    assert torch.equal(ce_high, ce_highest)


# ------------------------------------------------------------------------- options (issue 25), bf16 and fp32
def cross_entropy_options_ref(logits, target, weight, reduction, label_smoothing, softcap, lse_square_scale):
    """F.cross_entropy on the softcapped logits, plus scale * lse**2 per counted token (averaged over the
    counted tokens for the mean), all in the reference's dtype."""
    z = logits if softcap is None else softcap * torch.tanh(logits / softcap)
    loss = F.cross_entropy(z, target, weight=weight, reduction=reduction, label_smoothing=label_smoothing)
    counted = target != -100
    zl = lse_square_scale * torch.logsumexp(z, -1) ** 2 * counted
    if reduction == "none":
        return loss + zl
    return loss + (zl.sum() / counted.sum() if reduction == "mean" else zl.sum())


CE_OPTIONS = [
    dict(label_smoothing=0.1),
    dict(weight=True, label_smoothing=0.1),
    dict(softcap=30.0),
    dict(lse_square_scale=1e-4),
    dict(weight=True, label_smoothing=0.1, softcap=30.0, lse_square_scale=1e-4),
]


def _options(kwargs, vocab, dtype):
    kwargs = dict(kwargs)
    if kwargs.pop("weight", False):
        kwargs["weight"] = (0.5 + torch.rand(vocab, device="cuda")).to(dtype)
    return {"weight": None, "label_smoothing": 0.0, "softcap": None, "lse_square_scale": 0.0, **kwargs}


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("option", range(len(CE_OPTIONS)))
@pytest.mark.parametrize("vocab", [123, 40961, 128256])
def test_cross_entropy_options_bf16(vocab, option, reduction):
    rows = 64
    logits = bf16_leaf(rows, vocab, scale=4.0)
    target = torch.randint(0, vocab, (rows,), device="cuda")
    target[::7] = -100
    opts = _options(CE_OPTIONS[option], vocab, torch.bfloat16)
    loss = cross_entropy(logits, target, reduction=reduction, **opts)
    upstream = torch.randn(loss.shape, device="cuda").bfloat16()
    (grad,) = torch.autograd.grad(loss, logits, upstream)
    ref = cpu64(logits)
    ref_opts = {k: (v.cpu().double() if isinstance(v, torch.Tensor) else v) for k, v in opts.items()}
    loss_ref = cross_entropy_options_ref(ref, target.cpu(), reduction=reduction, **ref_opts)
    (grad_ref,) = torch.autograd.grad(loss_ref, ref, upstream.cpu().double())
    assert loss.dtype == torch.bfloat16 and grad.dtype == torch.bfloat16
    # The gradient is rounded to bf16 twice: stored by the forward, then scaled by the (random)
    # upstream value. The target entries of a mean, all about -(1 - eps) / rows, round alike each
    # time, so the error adds up: at most 2 x 2**-8 (seen: 5.1e-3 and 5.9e-3 at vocab 128256 on the
    # H100). F.cross_entropy rounds once; an upstream of 1 (loss.backward()) scales exactly.
    assert rel_err(loss, loss_ref) < BF16_TOL and rel_err(grad, grad_ref) < 2 * 2**-8
    assert torch.all(grad[::7] == 0)


@pytest.mark.parametrize("option", range(len(CE_OPTIONS)))
@pytest.mark.parametrize("rows,vocab", [(4096, 32000), (1024, 128256)])
def test_cross_entropy_options_fp32_matches_float64(rows, vocab, option):
    logits = fp32_leaf(rows, vocab, scale=4.0)
    target = torch.randint(0, vocab, (rows,), device="cuda")
    target[::97] = -100
    opts = _options(CE_OPTIONS[option], vocab, torch.float32)
    loss = cross_entropy(logits, target, **opts)
    (grad,) = torch.autograd.grad(2.5 * loss, logits)
    lr = gpu64(logits)
    ref_opts = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in opts.items()}
    loss_ref = cross_entropy_options_ref(lr, target, reduction="mean", **ref_opts)
    (grad_ref,) = torch.autograd.grad(2.5 * loss_ref, lr)
    assert loss.dtype == torch.float32
    assert rel_err(loss, loss_ref) < CE_FP32_TOL and rel_err(grad, grad_ref) < CE_FP32_TOL


def test_cross_entropy_options_all_ignored_and_bad_target_on_gpu():
    logits = bf16_leaf(5, 300)
    opts = _options(CE_OPTIONS[-1], 300, torch.bfloat16)
    loss = cross_entropy(logits, torch.full((5,), -100, device="cuda"), **opts)
    (grad,) = torch.autograd.grad(loss, logits)
    assert torch.isnan(loss) and torch.equal(grad, torch.zeros_like(grad))
    with pytest.raises(ValueError, match="target: value 300"):
        cross_entropy(logits, torch.tensor([1, 2, 300, 4, -100], device="cuda"), **opts)


def test_cross_entropy_under_autocast_is_float32():
    logits = bf16_leaf(64, 32000)
    target = torch.randint(0, 32000, (64,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = cross_entropy(logits, target, label_smoothing=0.1)
        ref = F.cross_entropy(logits, target, label_smoothing=0.1)
    assert loss.dtype == ref.dtype == torch.float32
    # Against float64 from the same bf16 logits: a float32 loss (not one rounded through bf16).
    ref64 = F.cross_entropy(gpu64(logits), target, label_smoothing=0.1)
    assert rel_err(loss, ref64) < 1e-5, (loss.item(), ref.item(), ref64.item())


@pytest.mark.parametrize("shape", [(5, 4097), (4096, 1024), (3, 65536)])
@pytest.mark.parametrize("offset", [None, 1.0])
def test_rms_norm_options_bf16(shape, offset):
    """offset=None: no weight (normalise only); 1.0: Gemma's x_hat * (1 + w)."""
    x = bf16_leaf(*shape)
    w = None if offset is None else bf16_leaf(shape[-1], scale=0.3)
    y = rms_norm(x, w, offset=offset or 0.0)
    dy = torch.randn(shape, device="cuda").bfloat16()
    grads = torch.autograd.grad(y, [x] if w is None else [x, w], dy)
    xr = cpu64(x)
    yr = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6)
    wr = None if w is None else cpu64(w)
    if wr is not None:
        yr = yr * (offset + wr)
    grads_ref = torch.autograd.grad(yr, [xr] if wr is None else [xr, wr], dy.cpu().double())
    assert rel_err(y, yr) < BF16_TOL
    for got, ref in zip(grads, grads_ref, strict=True):
        assert got.dtype == torch.bfloat16 and rel_err(got, ref) < BF16_TOL


@pytest.mark.parametrize("offset", [None, 1.0])
def test_rms_norm_options_fp32_matches_float64(offset):
    shape = (4096, 4096)
    x = fp32_leaf(*shape)
    w = None if offset is None else fp32_leaf(shape[-1], scale=0.3)
    y = rms_norm(x, w, offset=offset or 0.0)
    dy = torch.randn(shape, device="cuda")
    grads = torch.autograd.grad(y, [x] if w is None else [x, w], dy)
    xr = gpu64(x)
    yr = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6)
    wr = None if w is None else gpu64(w)
    if wr is not None:
        yr = yr * (offset + wr)
    grads_ref = torch.autograd.grad(yr, [xr] if wr is None else [xr, wr], dy.double())
    for got, ref in zip([y, *grads], [yr, *grads_ref], strict=True):
        assert got.dtype == torch.float32 and rel_err(got, ref) < FP32_TOL


@pytest.mark.parametrize("shape", [(7, 123), (64, 8192), (8192, 4096)])
def test_geglu_bf16_and_fp32(shape):
    for dtype, tol in ((torch.bfloat16, BF16_TOL), (torch.float32, FP32_TOL)):
        gate = (3 * torch.randn(shape, device="cuda")).to(dtype).requires_grad_()
        up = torch.randn(shape, device="cuda").to(dtype).requires_grad_()
        y = geglu(gate, up)
        dy = torch.randn(shape, device="cuda").to(dtype)
        dg, du = torch.autograd.grad(y, (gate, up), dy)
        gr, ur = gpu64(gate), gpu64(up)
        yr = F.gelu(gr, approximate="tanh") * ur
        dgr, dur = torch.autograd.grad(yr, (gr, ur), dy.double())
        for got, ref in ((y, yr), (dg, dgr), (du, dur)):
            # gelu's left tail: tiny values, measured against 1% of the largest
            assert got.dtype == dtype
            assert rel_err(got, ref, scale=0.01 * ref.detach().abs().max().item()) < tol
