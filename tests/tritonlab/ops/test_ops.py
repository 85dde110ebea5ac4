"""Kernel suite in the Triton interpreter (fp32, fp16) against float64 references, on odd shapes.

Tolerances: fp32 kernels accumulate in fp32, so their relative error (norm-wise) stays within a few
units of 2**-24 times the square root of the reduction length: 1e-5 leaves a wide margin at 4097.
fp16 outputs are rounded to 11 significant bits (2**-11 = 4.9e-4 relative per element): 2e-3.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from tritonlab.ops import (  # much the same list as phases/kernel_suite/bench.py's: a declaration, not logic
    cross_entropy,
    dequantize_fp8,
    gelu,
    quantize_fp8,
    rms_norm,
    rope,
    rope_cache,
    swiglu,
)
from tritonlab.testing import rel_err

FP32_TOL = 1e-5
FP16_TOL = 2e-3
ODD_SHAPES = [(1, 1), (7, 123), (3, 1500), (5, 4097)]
TOL = {torch.float32: FP32_TOL, torch.float16: FP16_TOL}


def leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_()


def f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().double().requires_grad_()


# ----------------------------------------------------------------------------------------------- RMSNorm
def rms_norm_ref(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize("shape", ODD_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rms_norm_matches_float64(shape, dtype):
    x = leaf(torch.randn(shape).to(dtype))
    w = leaf((1 + 0.3 * torch.randn(shape[-1])).to(dtype))
    y = rms_norm(x, w)
    dy = torch.randn(shape).to(dtype)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    xr, wr = f64(x), f64(w)
    yr = rms_norm_ref(xr, wr)
    dxr, dwr = torch.autograd.grad(yr, (xr, wr), dy.double())
    assert y.dtype == dtype and dx.dtype == dtype and dw.dtype == dtype
    # dx = rstd * (dy*w - xhat*mean(dy*w*xhat)): the two terms cancel exactly at width 1.
    dx_terms = (dy.double() * wr.detach() / xr.detach().pow(2).mean(-1, keepdim=True).sqrt()).norm().item()
    assert rel_err(y, yr) < TOL[dtype]
    assert rel_err(dx, dxr, scale=dx_terms) < TOL[dtype]
    assert rel_err(dw, dwr) < TOL[dtype]


def test_rms_norm_strided_input_and_zero_stride_grad():
    base = leaf(torch.randn(2, 3, 2 * 131))
    x = base[..., ::2]  # last-dimension stride 2, three dimensions
    w = leaf(torch.randn(131))
    y = rms_norm(x, w)
    y.sum().backward()  # the upstream gradient is an expanded scalar: all strides 0
    base_ref, wr = f64(base), f64(w)
    y_ref = rms_norm_ref(base_ref[..., ::2], wr)
    y_ref.sum().backward()
    assert y.shape == (2, 3, 131)
    assert rel_err(y, y_ref) < FP32_TOL
    assert rel_err(base.grad, base_ref.grad) < FP32_TOL  # zero in the skipped columns, on both sides
    assert rel_err(w.grad, wr.grad) < FP32_TOL


def test_rms_norm_bad_input():
    x = torch.randn(4, 16)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, torch.ones(15))
    with pytest.raises(ValueError, match="dtype"):
        rms_norm(x.to(torch.int32), torch.ones(16))
    with pytest.raises(ValueError, match="65536"):
        rms_norm(torch.randn(1, 65537), torch.ones(65537))
    with pytest.raises(ValueError, match="eps"):
        rms_norm(x, torch.ones(16), eps=0.0)


# ------------------------------------------------------------------------------------------ GELU, SwiGLU
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(1, 1), (7, 123), (5, 4097)])
def test_gelu_matches_float64(approximate, shape):
    x = leaf(3 * torch.randn(shape))
    y = gelu(x, approximate)
    dy = torch.randn(shape)
    (dx,) = torch.autograd.grad(y, x, dy)
    xr = f64(x)
    yr = F.gelu(xr, approximate=approximate)
    (dxr,) = torch.autograd.grad(yr, xr, dy.double())
    # Deep in the left tail (x < -4) fp32's erf(z) is -1 to within its absolute error of 2**-24, so
    # 1 + erf(z) -- in our kernel as in PyTorch's fp32 GELU -- is off by up to 6e-8 absolute: errors
    # are measured against 1% of ||x|| (resp. ||dy||) when the output itself is that small.
    assert rel_err(y, yr, scale=0.01 * x.norm().item()) < FP32_TOL
    assert rel_err(dx, dxr, scale=0.01 * dy.norm().item()) < FP32_TOL


def test_gelu_fp16_transposed_input_zero_stride_grad():
    x = leaf(torch.randn(123, 7).half())
    y = gelu(x.t())  # non-contiguous
    y.sum().backward()
    xr = f64(x)
    F.gelu(xr.t()).sum().backward()
    assert rel_err(y, F.gelu(xr.t())) < FP16_TOL and rel_err(x.grad, xr.grad) < FP16_TOL
    with pytest.raises(ValueError, match="approximate"):
        gelu(x, "exact")


@pytest.mark.parametrize("shape", [(1, 1), (7, 123), (3, 1500)])
def test_swiglu_matches_float64(shape):
    gate, up = leaf(3 * torch.randn(shape)), leaf(torch.randn(shape))
    y = swiglu(gate, up)
    dy = torch.randn(shape)
    dg, du = torch.autograd.grad(y, (gate, up), dy)
    gr, ur = f64(gate), f64(up)
    yr = F.silu(gr) * ur
    dgr, dur = torch.autograd.grad(yr, (gr, ur), dy.double())
    for got, ref in ((y, yr), (dg, dgr), (du, dur)):
        assert rel_err(got, ref) < FP32_TOL


def test_swiglu_fp16_chunked_views_zero_stride_grad():
    gate_up = leaf(torch.randn(7, 2 * 123).half())
    gate, up = gate_up.chunk(2, dim=-1)  # row stride 246: non-contiguous halves of one projection
    y = swiglu(gate, up)
    y.sum().backward()
    ref_in = f64(gate_up)
    gr, ur = ref_in.chunk(2, dim=-1)
    (F.silu(gr) * ur).sum().backward()
    assert rel_err(y, F.silu(gr) * ur) < FP16_TOL and rel_err(gate_up.grad, ref_in.grad) < FP16_TOL
    with pytest.raises(ValueError, match="shape"):
        swiglu(torch.randn(3, 4), torch.randn(3, 5))
    with pytest.raises(ValueError, match="dtype"):
        swiglu(torch.randn(3, 4), torch.randn(3, 4).half())


# -------------------------------------------------------------------------------------------------- RoPE
def rope_ref(x, cos, sin):
    half = x.shape[-1] // 2
    c, s = cos[None, : x.shape[1], None, :].double(), sin[None, : x.shape[1], None, :].double()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


# (B, T, Hq, Hk, D); the second has D/2 = 3, not a power of 2
@pytest.mark.parametrize("dims", [(2, 7, 3, 1, 8), (1, 5, 2, 2, 6)])
def test_rope_matches_float64(dims):
    batch, seq, hq, hk, d = dims
    q, k = leaf(torch.randn(batch, seq, hq, d)), leaf(torch.randn(batch, seq, hk, d))
    cos, sin = rope_cache(seq + 3, d)  # a longer cache than the sequence is fine
    qo, ko = rope(q, k, cos, sin)
    dq_out, dk_out = torch.randn_like(qo), torch.randn_like(ko)
    dq, dk = torch.autograd.grad((qo, ko), (q, k), (dq_out, dk_out))
    qr, kr = f64(q), f64(k)
    qor, kor = rope_ref(qr, cos, sin), rope_ref(kr, cos, sin)
    dqr, dkr = torch.autograd.grad((qor, kor), (qr, kr), (dq_out.double(), dk_out.double()))
    for got, ref in ((qo, qor), (ko, kor), (dq, dqr), (dk, dkr)):
        assert rel_err(got, ref) < FP32_TOL


def test_rope_strided_qkv_fp16_zero_stride_grad():
    qkv = leaf(torch.randn(2, 5, 3, 4, 8).half())  # a fused projection, viewed as (B, T, 3, H, D)
    q, k = qkv[:, :, 0], qkv[:, :, 1]
    cos, sin = rope_cache(5, 8)
    qo, ko = rope(q, k, cos, sin)
    (qo.sum() + ko.sum()).backward()
    ref_in = f64(qkv)
    qor, kor = rope_ref(ref_in[:, :, 0], cos, sin), rope_ref(ref_in[:, :, 1], cos, sin)
    (qor.sum() + kor.sum()).backward()
    assert rel_err(qo, qor) < FP16_TOL and rel_err(ko, kor) < FP16_TOL
    assert rel_err(qkv.grad, ref_in.grad) < FP16_TOL


def test_rope_bad_input():
    q, k = torch.randn(1, 4, 2, 8), torch.randn(1, 4, 1, 8)
    cos, sin = rope_cache(4, 8)
    with pytest.raises(ValueError, match="cos"):
        rope(q, k, cos[:, :3], sin)
    with pytest.raises(ValueError, match="k"):
        rope(q, torch.randn(1, 4, 1, 6), cos, sin)
    with pytest.raises(ValueError, match="even"):
        rope_cache(4, 7)


# ------------------------------------------------------------------------------------------ Cross-entropy
@pytest.mark.parametrize("rows,vocab", [(7, 5), (6, 123), (3, 40961)])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_matches_float64(rows, vocab, reduction):
    logits = leaf(4 * torch.randn(rows, vocab))
    target = torch.randint(0, vocab, (rows,))
    target[1] = -100  # ignored
    loss = cross_entropy(logits, target, reduction=reduction)
    # An upstream gradient other than 1 exercises the backward's scaling: 3 for the mean, per row for none.
    upstream = torch.tensor(3.0) if reduction == "mean" else torch.randn(rows)
    (dlogits,) = torch.autograd.grad(loss, logits, upstream)
    lr = f64(logits)
    loss_ref = F.cross_entropy(lr, target, reduction=reduction)
    (dref,) = torch.autograd.grad(loss_ref, lr, upstream.double())
    assert loss.dtype == torch.float32 and dlogits.dtype == logits.dtype
    assert rel_err(loss, loss_ref) < FP32_TOL and rel_err(dlogits, dref) < FP32_TOL
    assert torch.all(dlogits[1] == 0)


def test_cross_entropy_fp16_strided_rows_sum_and_zero_stride_grad():
    wide = leaf((3 * torch.randn(5, 200)).half())
    logits = wide[:, :123]  # row stride 200
    target = torch.tensor([0, 122, -100, 7, 64])
    loss = cross_entropy(logits, target, reduction="none")
    loss.sum().backward()  # expanded upstream gradient, stride 0
    ref_in = f64(wide)
    F.cross_entropy(ref_in[:, :123], target, reduction="none").sum().backward()
    assert rel_err(loss, F.cross_entropy(ref_in[:, :123], target, reduction="none")) < FP16_TOL
    assert rel_err(wide.grad, ref_in.grad) < FP16_TOL

    summed = cross_entropy(logits.detach(), target, reduction="sum")  # no gradient wanted: loss only
    assert rel_err(summed, F.cross_entropy(ref_in[:, :123], target, reduction="sum")) < FP16_TOL


def test_cross_entropy_inplace_and_edge_cases():
    logits = leaf(torch.randn(4, 37))
    target = torch.tensor([3, 0, 36, -100])
    work = logits.detach().clone().requires_grad_()
    loss = cross_entropy(work, target, inplace=True)
    (grad,) = torch.autograd.grad(loss, work)
    lr = f64(logits)
    (gref,) = torch.autograd.grad(F.cross_entropy(lr, target), lr)
    assert grad.data_ptr() == work.data_ptr()  # written over the logits, as asked
    assert rel_err(grad, gref) < FP32_TOL

    # Every target ignored: a mean over nothing is NaN, as in PyTorch, and the gradient is zero.
    all_ignored = cross_entropy(leaf(logits), torch.full((4,), -100))
    assert torch.isnan(all_ignored)

    loss = cross_entropy(leaf(logits), target)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()


def test_cross_entropy_bad_input():
    logits = torch.randn(3, 10)
    with pytest.raises(ValueError, match="target: value 10"):
        cross_entropy(logits, torch.tensor([1, 10, 2]))
    with pytest.raises(ValueError, match="target: value -1"):
        cross_entropy(logits, torch.tensor([1, -1, 2]))
    with pytest.raises(ValueError, match="int64"):
        cross_entropy(logits, torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="shape"):
        cross_entropy(logits, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="reduction"):
        cross_entropy(logits, torch.tensor([1, 2, 3]), reduction="avg")


# ---------------------------------------------------------------------------------------------------- FP8
def e4m3_ulp(v: torch.Tensor) -> torch.Tensor:
    """Spacing of e4m3 values around |v|: 3 mantissa bits, smallest normal exponent -6."""
    exponent = torch.floor(torch.log2(v.abs().clamp_min(2.0**-6)))
    return torch.exp2(exponent - 3)


@pytest.mark.parametrize("granularity", ["row", "block"])
@pytest.mark.parametrize("shape", ODD_SHAPES)
def test_quantize_fp8_rounds_within_an_ulp(granularity, shape):
    x = 5 * torch.randn(shape)
    if shape[0] > 1:
        x[1] = 0.0  # an all-zero row gets scale 1
    q, scales = quantize_fp8(x, granularity, block=128)
    groups = 1 if granularity == "row" else math.ceil(shape[1] / 128)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape and scales.shape == (shape[0], groups)
    width = shape[1] if granularity == "row" else 128
    padded = torch.nn.functional.pad(x.double(), (0, groups * width - shape[1]))
    amax = padded.view(shape[0], groups, width).abs().amax(-1)
    expected = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    assert torch.allclose(scales.double(), expected, rtol=1e-6, atol=0)
    target = x.double() / scales.double().repeat_interleave(width, -1)[:, : shape[1]]
    # Round to nearest: within half an ulp, plus the 1e-7 relative error of multiplying by 1/scale in fp32.
    assert torch.all((q.double() - target).abs() <= 0.5 * e4m3_ulp(target) + 1e-6 * target.abs())
    # ... and the same e4m3 bits as PyTorch's own rounding of the fp32 quotient.
    quotient = (x * (1 / scales).repeat_interleave(width, -1)[:, : shape[1]]).clamp(-448, 448)
    assert torch.equal(q.view(torch.uint8), quotient.to(torch.float8_e4m3fn).view(torch.uint8))
    assert q.double().abs().max() <= 448


@pytest.mark.parametrize("granularity", ["row", "block"])
def test_dequantize_fp8_is_q_times_scale(granularity):
    x = 3 * torch.randn(3, 1500)
    q, scales = quantize_fp8(x, granularity, block=256)
    width = 1500 if granularity == "row" else 256
    expected = q.double() * scales.double().repeat_interleave(width, -1)[:, :1500]
    y = dequantize_fp8(q, scales, granularity, block=256, dtype=torch.float32)
    assert y.dtype == torch.float32 and rel_err(y, expected) < 1e-7


def test_fp8_bad_input():
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match="granularity"):
        quantize_fp8(x, "column")
    with pytest.raises(ValueError, match="block"):
        quantize_fp8(x, "block", block=100)
    q, scales = quantize_fp8(x, "block", block=32)
    with pytest.raises(ValueError, match="scales"):
        dequantize_fp8(q, scales, "row")
    with pytest.raises(ValueError, match="dtype"):
        dequantize_fp8(x, scales, "block", block=32)


def test_cross_entropy_unchecked_targets_turn_their_rows_to_nan():
    # check_targets=False skips the sync, not the safety: the bad row is never read, and its
    # loss and gradient row are NaN; the other rows keep their exact values.
    logits = leaf(torch.randn(3, 10))
    loss = cross_entropy(logits, torch.tensor([1, 10, 2]), reduction="none", check_targets=False)
    (grad,) = torch.autograd.grad(loss.sum(), logits)
    ref = F.cross_entropy(logits.detach(), torch.tensor([1, 0, 2]), reduction="none")
    assert torch.isnan(loss[1]) and torch.isnan(grad[1]).all()
    assert torch.allclose(loss[[0, 2]], ref[[0, 2]], atol=1e-5) and not torch.isnan(grad[[0, 2]]).any()


# ------------------------------------------------------------------------------- the package's surface
def test_public_api_is_exactly_the_ops():
    import tritonlab.ops as ops

    # Written out, not read from ops/__init__.py: a change to the public surface must change this test too.
    assert sorted(ops.__all__) == sorted(
        [
            "FP8_DTYPE",
            "FP8_MAX",
            "GEGLU",
            "GELU",
            "CrossEntropyLoss",
            "FusedLinearCrossEntropyLoss",
            "fused_linear_cross_entropy",
            "RMSNorm",
            "RotaryEmbedding",
            "SwiGLU",
            "add_rms_norm",
            "cross_entropy",
            "dequantize_fp8",
            "geglu",
            "gelu",
            "linear",
            "linears",
            "quantize_fp8",
            "rms_norm",
            "rope",
            "rope_cache",
            "swiglu",
        ]
    )
    for name in ops.__all__:
        assert getattr(ops, name) is not None


def test_modules_wrap_the_functions():
    from tritonlab.ops import GELU, CrossEntropyLoss, RMSNorm, RotaryEmbedding, SwiGLU

    x = torch.randn(3, 2, 16)
    norm = RMSNorm(16)
    assert rel_err(norm(x), rms_norm_ref(x.double(), norm.weight.double())) < FP32_TOL
    assert rel_err(GELU("tanh")(x), F.gelu(x.double(), approximate="tanh")) < FP32_TOL
    gate_up = torch.randn(3, 32)
    assert rel_err(SwiGLU()(gate_up), F.silu(gate_up[:, :16].double()) * gate_up[:, 16:].double()) < FP32_TOL
    q, k = torch.randn(1, 4, 2, 8), torch.randn(1, 4, 1, 8)
    qo, ko = RotaryEmbedding(8, 6)(q, k)
    cos, sin = rope_cache(6, 8)
    assert rel_err(qo, rope_ref(q.double(), cos, sin)) < FP32_TOL
    logits, target = torch.randn(4, 9), torch.tensor([1, 2, -100, 8])
    assert rel_err(CrossEntropyLoss()(logits, target), F.cross_entropy(logits.double(), target)) < FP32_TOL


@pytest.mark.parametrize(
    "call",
    [
        lambda: rms_norm([1.0, 2.0], torch.ones(2)),
        lambda: gelu(torch.arange(4)),
        lambda: swiglu(torch.randn(3), "up"),
        lambda: rope(
            torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4), torch.randn(2, 2).double(), torch.randn(2, 2)
        ),
        lambda: cross_entropy(torch.randn(3), torch.tensor([0, 1, 2])),
        lambda: quantize_fp8(torch.randn(4, 8).double()),
    ],
)
def test_bad_input_is_a_value_error_naming_the_argument(call):
    with pytest.raises(ValueError, match=r"^(x|up|cos|logits|gate|q|k|sin)\b"):
        call()


def test_config_spaces_follow_element_size_and_shared_memory():
    from tritonlab.ops.cross_entropy import CrossEntropySettings
    from tritonlab.ops.rms_norm import RMSNormSettings, _bwd_stages

    settings = CrossEntropySettings(block_bytes=65536)
    # The same bytes per sweep-1 iteration whatever the dtype: float32 blocks hold half the logits.
    assert settings.block_v(2) == 32768 and settings.block_v(4) == 16384
    rms = RMSNormSettings()
    assert _bwd_stages(16 * 128 * 2, rms) == rms.bwd_stages  # narrow bf16 rows: pipelined
    assert _bwd_stages(65536 * 4, rms) == 1  # one float32 row of 65 536: too big to prefetch
    assert _bwd_stages(8192 * 4, RMSNormSettings(pipeline_smem_bytes=1 << 40)) == rms.bwd_stages


def test_explicit_settings_reach_the_kernels():
    from tritonlab.ops.cross_entropy import CrossEntropyFunction, CrossEntropySettings
    from tritonlab.ops.rms_norm import RMSNormFunction, RMSNormSettings

    logits = leaf(torch.randn(6, 700))
    target = torch.randint(0, 700, (6,))
    loss = CrossEntropyFunction.apply(
        logits, target, -100, "mean", False, True, CrossEntropySettings(256, 4, 0.5)
    )
    (grad,) = torch.autograd.grad(loss, logits)
    lr = f64(logits)
    (gref,) = torch.autograd.grad(F.cross_entropy(lr, target), lr)
    assert rel_err(loss, F.cross_entropy(lr, target)) < FP32_TOL and rel_err(grad, gref) < FP32_TOL

    x, w = leaf(torch.randn(33, 40)), leaf(torch.ones(40))
    y = RMSNormFunction.apply(x, w, 1e-6, RMSNormSettings(bwd_warps_per_sm=4, bwd_stages=2))
    dx, dw = torch.autograd.grad(y, (x, w), torch.ones_like(y))
    xr, wr = f64(x), f64(w)
    dxr, dwr = torch.autograd.grad(rms_norm_ref(xr, wr), (xr, wr), torch.ones(33, 40, dtype=torch.float64))
    assert rel_err(dw, dwr) < FP32_TOL
    assert rel_err(dx, dxr, scale=xr.norm().item() / 40) < 1e-4
