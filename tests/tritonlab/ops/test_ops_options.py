"""The ops' options in the Triton interpreter (fp32, fp16) against float64 references, on odd shapes.

Cross-entropy: ``weight``, ``label_smoothing`` (alone and together, with ``ignore_index``), ``softcap``
and ``lse_square_scale`` under every reduction, against ``F.cross_entropy`` with the same options
in float64 (softcap and z-loss written out around it). RMSNorm without a weight and with an offset;
GEGLU; and each bad input raising a ``ValueError`` that names the argument.

Tolerances as in test_ops.py: fp32 accumulates in fp32 (1e-5 norm-wise leaves a wide margin at
these lengths); fp16 outputs are rounded to 11 significant bits: 2e-3. The interpreter's blocks are
2 KB (512 float32 / 1024 float16 logits), so 1500 and 4097 classes end in a partial block.
"""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from tritonlab.ops import GEGLU, CrossEntropyLoss, RMSNorm, cross_entropy, geglu, rms_norm
from tritonlab.ops.cross_entropy import (
    DEFAULT_SETTINGS,
    SHORT_ROW_SETTINGS,
    SOFTCAP_FIXED_MAX,
    SOFTCAP_SHORT_ROW_SETTINGS,
    CrossEntropyFunction,
    CrossEntropyOptions,
    CrossEntropySettings,
    row_align,
    settings_for,
)
from tritonlab.testing import rel_err

FP32_TOL = 1e-5
FP16_TOL = 2e-3
TOL = {torch.float32: FP32_TOL, torch.float16: FP16_TOL}
IGNORE = -100


def leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_()


def f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().double().requires_grad_()


# ------------------------------------------------------------------------------------------ Cross-entropy
def cross_entropy_ref(
    logits,
    target,
    weight=None,
    ignore_index=IGNORE,
    reduction="mean",
    label_smoothing=0.0,
    softcap=None,
    lse_square_scale=0.0,
):
    """F.cross_entropy on the (softcapped) logits, plus scale * lse**2 per counted token (averaged
    over the counted tokens for the mean)."""
    z = logits if softcap is None else softcap * torch.tanh(logits / softcap)
    z2, t = z.reshape(-1, z.shape[-1]), target.reshape(-1)
    loss = F.cross_entropy(
        z2, t, weight=weight, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing
    )
    if lse_square_scale:
        counted = t != ignore_index
        zl = lse_square_scale * torch.logsumexp(z2, -1) ** 2 * counted
        if reduction == "none":
            loss = loss + zl
        elif reduction == "sum":
            loss = loss + zl.sum()
        else:
            loss = loss + zl.sum() / counted.sum()
    return loss.reshape(target.shape) if reduction == "none" else loss


OPTIONS = {
    "weight": dict(weight=True),
    "smoothing": dict(label_smoothing=0.2),
    "weight+smoothing": dict(weight=True, label_smoothing=0.3),
    "softcap": dict(softcap=2.5),
    "zloss": dict(lse_square_scale=1e-2),
    "all": dict(weight=True, label_smoothing=0.1, softcap=6.0, lse_square_scale=1e-3),
}


def _case(rows, vocab, dtype, option, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = (4 * torch.randn(rows, vocab, generator=gen)).to(dtype)
    target = torch.randint(0, vocab, (rows,), generator=gen)
    if rows > 2:
        target[1] = IGNORE
    kwargs = dict(OPTIONS[option])
    if kwargs.pop("weight", False):
        kwargs["weight"] = (0.5 + torch.rand(vocab, generator=gen)).to(dtype)
    return logits, target, kwargs


def _check_cross_entropy(logits, target, kwargs, reduction, upstream, tol):
    x = leaf(logits)
    loss = cross_entropy(x, target, reduction=reduction, **kwargs)
    (grad,) = torch.autograd.grad(loss, x, upstream)
    xr = f64(logits)
    ref_kwargs = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    loss_ref = cross_entropy_ref(xr, target, reduction=reduction, **ref_kwargs)
    (grad_ref,) = torch.autograd.grad(loss_ref, xr, upstream.double())
    assert loss.dtype == logits.dtype and loss.shape == loss_ref.shape
    assert grad.dtype == logits.dtype
    assert rel_err(loss, loss_ref) < tol, (rel_err(loss, loss_ref), tol)
    assert rel_err(grad, grad_ref) < tol, (rel_err(grad, grad_ref), tol)
    return loss, grad


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows,vocab", [(7, 123), (3, 1500)])
def test_cross_entropy_options_match_float64(rows, vocab, dtype, reduction, option):
    logits, target, kwargs = _case(rows, vocab, dtype, option)
    # An upstream gradient other than 1: scales the stored gradient in the backward.
    upstream = torch.tensor(2.5) if reduction != "none" else torch.randn(rows)
    upstream = upstream.to(dtype)
    _, grad = _check_cross_entropy(logits, target, kwargs, reduction, upstream, TOL[dtype])
    assert torch.all(grad[1] == 0)  # the ignored row


@pytest.mark.parametrize("option", ["weight+smoothing", "all"])
def test_cross_entropy_options_one_token_and_leading_dims(option):
    logits, target, kwargs = _case(1, 4097, torch.float32, option)
    _check_cross_entropy(logits, target, kwargs, "mean", torch.tensor(1.0), FP32_TOL)
    logits, target, kwargs = _case(6, 37, torch.float32, option, seed=1)
    logits, target = logits.view(2, 3, 37), target.view(2, 3)
    _check_cross_entropy(logits, target, kwargs, "none", torch.randn(2, 3), FP32_TOL)


@pytest.mark.parametrize("option", list(OPTIONS))
def test_cross_entropy_options_all_ignored(option):
    """Every target ignored, as in PyTorch: the mean is NaN (0/0), the sum 0, each row 0, and the
    gradient exactly 0 everywhere (no inf * 0)."""
    logits, _, kwargs = _case(4, 50, torch.float32, option)
    target = torch.full((4,), IGNORE)
    for reduction in ("mean", "sum", "none"):
        x = leaf(logits)
        loss = cross_entropy(x, target, reduction=reduction, **kwargs)
        (grad,) = torch.autograd.grad(loss.sum(), x)
        ref_kwargs = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
        ref = cross_entropy_ref(f64(logits), target, reduction=reduction, **ref_kwargs)
        if reduction == "mean":
            assert torch.isnan(loss) and torch.isnan(ref)
        else:
            assert torch.equal(loss, ref.float())
        assert torch.equal(grad, torch.zeros_like(grad))


def test_cross_entropy_custom_ignore_index_with_weight_and_smoothing():
    logits, target, kwargs = _case(9, 77, torch.float32, "weight+smoothing")
    target[[0, 4]] = 5  # ignore class 5 instead of -100; class 5 keeps its weight in the smoothing sum
    target[target == IGNORE] = 3
    x = leaf(logits)
    loss = cross_entropy(x, target, ignore_index=5, **kwargs)
    (grad,) = torch.autograd.grad(loss, x)
    xr = f64(logits)
    ref = F.cross_entropy(xr, target, weight=kwargs["weight"].double(), ignore_index=5, label_smoothing=0.3)
    (grad_ref,) = torch.autograd.grad(ref, xr)
    assert rel_err(loss, ref) < FP32_TOL and rel_err(grad, grad_ref) < FP32_TOL


def test_cross_entropy_float32_weight_with_fp16_logits():
    logits, target, kwargs = _case(5, 300, torch.float16, "weight")
    kwargs["weight"] = kwargs["weight"].float()  # accepted: the kernel reads weights in float32
    _check_cross_entropy(logits, target, kwargs, "mean", torch.tensor(1.0, dtype=torch.float16), FP16_TOL)


@pytest.mark.parametrize("fixed", [True, False])
@pytest.mark.parametrize("softcap", [30.0, SOFTCAP_FIXED_MAX, 1.5 * SOFTCAP_FIXED_MAX])
def test_cross_entropy_softcap_with_the_fixed_and_the_running_max(softcap, fixed):
    # Every logit far below -softcap: z sits at -softcap, each exponential of the fixed-max sweep at
    # exp(-2 softcap), which must stay a normal float32 up to SOFTCAP_FIXED_MAX (above it the running
    # max takes over whatever the setting says); one row with a spread of logits beside them.
    gen = torch.Generator().manual_seed(3)
    logits = -4 * softcap + torch.randn(4, 301, generator=gen)
    logits[2] = softcap * torch.randn(301, generator=gen)
    target = torch.randint(0, 301, (4,), generator=gen)
    options = CrossEntropyOptions(label_smoothing=0.1, softcap=softcap)
    settings = dataclasses.replace(DEFAULT_SETTINGS, fixed_max=fixed)
    x = leaf(logits)
    loss = CrossEntropyFunction.apply(x, target, IGNORE, "mean", False, True, settings, options)
    (grad,) = torch.autograd.grad(loss, x)
    xr = f64(logits)
    ref = cross_entropy_ref(xr, target, label_smoothing=0.1, softcap=softcap)
    (grad_ref,) = torch.autograd.grad(ref, xr)
    assert rel_err(loss, ref) < FP32_TOL and rel_err(grad, grad_ref) < FP32_TOL


# The tiles' rows kept in each thread (one warp: 32 x 16-byte columns, so 4 tile rows at the
# interpreter's 2 KB blocks), the target's gradient through the comparison a logit instead of its
# store after the row, and the smoothing's logit sum in sweep 1 with a gradient too.
_VARIANT_SETTINGS = {
    "tiled": dict(block_bytes=2048, num_warps=1),
    "target compared": dict(block_bytes=2048, num_warps=1, target_fixup=False),
    "sum in sweep 1": dict(block_bytes=2048, num_warps=1, smoothing_sum_sweep2=False),
}


def test_cross_entropy_settings_follow_the_row_length_and_alignment():
    # Rows up to 100 KiB run two programs an SM on 64 registers; longer ones one program.
    assert settings_for(32000, 2) is SHORT_ROW_SETTINGS and settings_for(50257, 2) is SHORT_ROW_SETTINGS
    assert settings_for(65536, 2) is DEFAULT_SETTINGS and settings_for(32000, 4) is DEFAULT_SETTINGS
    assert SHORT_ROW_SETTINGS.launch_options()["maxnreg"] == 64
    assert "maxnreg" not in DEFAULT_SETTINGS.launch_options()
    # The short rows' smoothing sums in sweep 1, except beside the fixed max or on unaligned rows.
    assert not SHORT_ROW_SETTINGS.smoothing_in_sweep2(None, 64000)
    assert SHORT_ROW_SETTINGS.smoothing_in_sweep2(30.0, 64000)
    assert not SHORT_ROW_SETTINGS.smoothing_in_sweep2(100.0, 64000)  # past the fixed max's range
    assert SHORT_ROW_SETTINGS.smoothing_in_sweep2(None, 100514)
    assert DEFAULT_SETTINGS.smoothing_in_sweep2(None, 256512)
    # The softcap's fixed max on rows of at most 64 KiB: four programs an SM; longer rows, a softcap
    # past the fixed max's range and the other options keep the row length's settings.
    assert settings_for(32000, 2, 30.0) is SOFTCAP_SHORT_ROW_SETTINGS
    assert SOFTCAP_SHORT_ROW_SETTINGS.programs_per_sm == 4 and SOFTCAP_SHORT_ROW_SETTINGS.num_warps == 8
    assert settings_for(50257, 2, 30.0) is SHORT_ROW_SETTINGS
    assert settings_for(32000, 2, 1.5 * SOFTCAP_FIXED_MAX) is SHORT_ROW_SETTINGS
    assert settings_for(128256, 2, 30.0) is DEFAULT_SETTINGS


def test_cross_entropy_blocks_halve_where_the_last_one_would_be_mostly_padding():
    # (the GPU's short-row and long-row blocks: 32 and 64 KB)
    short, long = CrossEntropySettings(32768, 16, 2.0), CrossEntropySettings(65536, 32, 1.0)
    assert short.block_v(2) == short.block_v(2, 32000) == 16384  # 2.4% padding
    assert short.block_v(2, 50257) == 8192  # 30% padding at 16 384, 14% at 8 192
    assert long.block_v(2, 128256) == 32768 and long.block_v(2, 100277) == 16384
    # float32: 16 384 logits a 64 KB block, the same rule
    assert long.block_v(4, 100277) == 16384 and long.block_v(4, 50257) == 8192
    # never below one 16-byte vector a thread (16 warps: 4 096 bf16 logits), however short the row
    assert short.block_v(2, 1) == 4096 and short.tile_cols(2, 1) == 4096


@pytest.mark.parametrize("variant", list(_VARIANT_SETTINGS))
@pytest.mark.parametrize("option", ["weight+smoothing", "softcap", "all"])
@pytest.mark.parametrize("vocab", [123, 4096, 4097])
def test_cross_entropy_options_settings_variants_match_float64(variant, option, vocab):
    """Every settings variant of the options kernel against float64: vocab 4096 fills its last
    block exactly (fp32: 512 logits a block), 4097 leaves one logit in it, 123 never fills one."""
    logits, target, kwargs = _case(5, vocab, torch.float32, option, seed=4)
    if option != "all":
        kwargs["softcap"] = 30.0  # the fixed max
    settings = CrossEntropySettings(**_VARIANT_SETTINGS[variant])
    options = CrossEntropyOptions(
        kwargs.get("weight"), kwargs.get("label_smoothing", 0.0), kwargs.get("softcap"),
        kwargs.get("lse_square_scale", 0.0),
    )  # fmt: skip
    x = leaf(logits)
    loss = CrossEntropyFunction.apply(x, target, IGNORE, "mean", False, True, settings, options)
    (grad,) = torch.autograd.grad(loss, x)
    xr = f64(logits)
    ref_kwargs = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    ref = cross_entropy_ref(xr, target, **ref_kwargs)
    (grad_ref,) = torch.autograd.grad(ref, xr)
    assert rel_err(loss, ref) < FP32_TOL and rel_err(grad, grad_ref) < FP32_TOL
    assert torch.all(grad[1] == 0)  # the ignored row: no target store


def test_rows_that_are_not_whole_vectors_are_swept_from_the_boundary_before_them():
    # 16-byte vectors: 8 fp16 or 4 float32 logits; 1 = the rows are whole vectors already.
    assert row_align(torch.empty(4, 64, dtype=torch.float16), torch.empty(4, 64, dtype=torch.float16)) == 1
    odd = torch.empty(4, 50257, dtype=torch.float16)
    assert row_align(odd, torch.empty_like(odd)) == 8
    assert row_align(odd.float(), torch.empty_like(odd.float())) == 4
    # a start off a 16-byte boundary, or a gradient whose rows sit elsewhere: the element-wise sweeps
    wide = torch.empty(4, 50264, dtype=torch.float16)
    assert row_align(wide[:, 1:], torch.empty(4, 50263, dtype=torch.float16)) == 1
    assert row_align(wide[:, :50257], torch.empty_like(odd)) == 1
    assert row_align(wide[:, :50257], wide[:, :50257]) == 8  # in place: the same rows


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("option", [None, "smoothing", "softcap", "all"])
@pytest.mark.parametrize("vocab", [1, 3, 7, 9, 15, 17, 29])
def test_cross_entropy_rows_shorter_than_a_few_vectors_match_float64(vocab, option, inplace):
    """fp16 rows of a few logits, contiguous: each row starts a different distance past a 16-byte
    boundary, so the sweeps' edges (before the first whole vector, after the last) take every
    shape -- empty, both in one vector, no whole vector at all. In place, a store past a row's edge
    would spoil the next row's logits before they are read."""
    logits, target, kwargs = _case(11, vocab, torch.float16, option or "weight", seed=vocab)
    if option is None:
        kwargs = {}
    else:
        kwargs.pop("weight", None)
    options = CrossEntropyOptions(
        None, kwargs.get("label_smoothing", 0.0), kwargs.get("softcap"), kwargs.get("lse_square_scale", 0.0)
    )
    x = leaf(logits.clone())
    loss = CrossEntropyFunction.apply(
        x.clone() if inplace else x, target, IGNORE, "sum", inplace, True, None, options
    )
    (grad,) = torch.autograd.grad(loss, x)
    xr = f64(logits)
    ref = cross_entropy_ref(xr, target, reduction="sum", **kwargs)
    (grad_ref,) = torch.autograd.grad(ref, xr)
    # (one class: the loss and the gradient are 0, up to the lse's rounding; hence the floor of 1)
    assert (loss.double() - ref).abs() <= FP16_TOL * max(ref.abs().item(), 1.0)
    assert (grad.double() - grad_ref).norm() <= FP16_TOL * max(grad_ref.norm().item(), 1.0)


@pytest.mark.parametrize("variant", list(_VARIANT_SETTINGS))
@pytest.mark.parametrize("option", ["weight+smoothing", "all"])
def test_cross_entropy_smoothing_without_a_gradient_sums_in_sweep_1(variant, option):
    """Logits that need no gradient: no sweep 2, so sweep 1 sums the logits for the smoothing."""
    logits, target, kwargs = _case(5, 4097, torch.float32, option, seed=7)
    settings = CrossEntropySettings(**_VARIANT_SETTINGS[variant])
    options = CrossEntropyOptions(
        kwargs.get("weight"), kwargs.get("label_smoothing", 0.0), kwargs.get("softcap"),
        kwargs.get("lse_square_scale", 0.0),
    )  # fmt: skip
    loss = CrossEntropyFunction.apply(logits, target, IGNORE, "none", False, True, settings, options)
    ref_kwargs = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    ref = cross_entropy_ref(logits.double(), target, reduction="none", **ref_kwargs)
    assert rel_err(loss, ref) < FP32_TOL


def test_cross_entropy_plain_target_store_matches_the_comparison():
    logits, target, _ = _case(6, 1500, torch.float32, "softcap", seed=5)
    grads = []
    for fixup in (True, False):
        x = leaf(logits)
        settings = CrossEntropySettings(block_bytes=2048, num_warps=1, target_fixup=fixup)
        loss = CrossEntropyFunction.apply(x, target, IGNORE, "sum", False, True, settings, None)
        grads.append(torch.autograd.grad(loss, x)[0])
    assert torch.equal(grads[0], grads[1])
    xr = f64(logits)
    (grad_ref,) = torch.autograd.grad(F.cross_entropy(xr, target, reduction="sum"), xr)
    assert rel_err(grads[0], grad_ref) < FP32_TOL


def test_cross_entropy_large_softcap_is_the_plain_loss():
    logits, target, _ = _case(6, 123, torch.float32, "softcap")
    capped = cross_entropy(logits, target, softcap=1e4)
    assert rel_err(capped, F.cross_entropy(logits.double(), target)) < 1e-5


def test_cross_entropy_under_autocast_returns_float32_like_torch():
    logits, target, kwargs = _case(5, 64, torch.float16, "smoothing")
    x = leaf(logits)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = cross_entropy(x, target, **kwargs)
        ref = F.cross_entropy(logits, target, **kwargs)
    assert loss.dtype == ref.dtype == torch.float32
    (grad,) = torch.autograd.grad(loss, x)
    assert grad.dtype == torch.float16
    assert rel_err(loss, F.cross_entropy(logits.double(), target, **kwargs)) < FP32_TOL


def test_cross_entropy_loss_module_takes_the_options():
    logits, target, kwargs = _case(7, 123, torch.float32, "all")
    module = CrossEntropyLoss(**kwargs, reduction="sum")
    assert "weight" in dict(module.named_buffers())
    got = module(logits, target)
    ref_kwargs = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    assert rel_err(got, cross_entropy_ref(logits.double(), target, reduction="sum", **ref_kwargs)) < FP32_TOL
    assert CrossEntropyLoss()(logits, target).dtype == torch.float32


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(weight=torch.ones(9)), "^weight: expected one weight per class"),
        (dict(weight=torch.ones(10, 1)), "^weight: expected 1 dimensions"),
        (dict(weight=torch.ones(10, dtype=torch.float64)), "^weight: unsupported dtype"),
        (dict(weight=torch.ones(10, dtype=torch.int64)), "^weight: unsupported dtype"),
        (dict(weight=torch.ones(10, device="meta")), "^weight: expected a tensor on"),
        (dict(weight=torch.ones(10).requires_grad_()), "^weight: class weights get no gradient"),
        (dict(weight=[1.0] * 10), "^weight: expected a torch.Tensor"),
        (dict(label_smoothing=-0.1), "^label_smoothing"),
        (dict(label_smoothing=1.5), "^label_smoothing"),
        (dict(label_smoothing=float("nan")), "^label_smoothing"),
        (dict(softcap=0.0), "^softcap"),
        (dict(softcap=-3.0), "^softcap"),
        (dict(softcap=float("inf")), "^softcap"),
        (dict(lse_square_scale=-1e-4), "^lse_square_scale"),
        (dict(lse_square_scale=float("nan")), "^lse_square_scale"),
        (dict(reduction="avg"), "^reduction"),
        (dict(reduction="batchmean"), "^reduction"),
        (dict(ignore_index=1.5), "^ignore_index"),
    ],
)
def test_cross_entropy_bad_options_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cross_entropy(torch.randn(3, 10), torch.tensor([1, 2, 3]), **kwargs)


@pytest.mark.parametrize("bad", [10, -1, 1000])
def test_cross_entropy_target_out_of_range_with_options(bad):
    with pytest.raises(ValueError, match=f"^target: value {bad} is outside"):
        cross_entropy(
            torch.randn(3, 10),
            torch.tensor([1, bad, 3]),
            weight=torch.rand(10),
            label_smoothing=0.1,
            softcap=5.0,
            lse_square_scale=1e-4,
        )


def test_cross_entropy_unchecked_target_with_options_is_nan_not_a_wrong_loss():
    x = leaf(torch.randn(3, 10))
    loss = cross_entropy(
        x,
        torch.tensor([1, 10, 3]),
        weight=torch.rand(10),
        label_smoothing=0.1,
        lse_square_scale=1e-3,
        reduction="none",
        check_targets=False,
    )
    (grad,) = torch.autograd.grad(loss.sum(), x)
    assert torch.isnan(loss[1]) and torch.isnan(grad[1]).all()
    assert torch.isfinite(loss[[0, 2]]).all() and torch.isfinite(grad[[0, 2]]).all()


# ------------------------------------------------------------------------------------------------ RMSNorm
def rms_norm_ref(x, w=None, eps=1e-6, offset=0.0):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * (offset + w)


@pytest.mark.parametrize("shape", [(1, 1), (7, 123), (5, 4097)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rms_norm_without_weight(shape, dtype):
    x = leaf(torch.randn(shape).to(dtype))
    y = rms_norm(x)
    dy = torch.randn(shape).to(dtype)
    (dx,) = torch.autograd.grad(y, x, dy)
    xr = f64(x)
    yr = rms_norm_ref(xr)
    (dxr,) = torch.autograd.grad(yr, xr, dy.double())
    # dx's two terms cancel exactly at width 1: measure against their size there.
    dx_terms = (dy.double() / xr.detach().pow(2).mean(-1, keepdim=True).sqrt()).norm().item()
    assert y.dtype == dtype and dx.dtype == dtype
    assert rel_err(y, yr) < TOL[dtype] and rel_err(dx, dxr, scale=dx_terms) < TOL[dtype]


@pytest.mark.parametrize("offset", [1.0, -0.25])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(7, 123), (3, 1500)])
def test_rms_norm_offset(shape, dtype, offset):
    x = leaf(torch.randn(shape).to(dtype))
    w = leaf((0.3 * torch.randn(shape[-1])).to(dtype))  # Gemma's weights sit near 0
    y = rms_norm(x, w, offset=offset)
    dy = torch.randn(shape).to(dtype)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    xr, wr = f64(x), f64(w)
    yr = rms_norm_ref(xr, wr, offset=offset)
    dxr, dwr = torch.autograd.grad(yr, (xr, wr), dy.double())
    for got, ref in ((y, yr), (dx, dxr), (dw, dwr)):
        assert got.dtype == dtype and rel_err(got, ref) < TOL[dtype]


@pytest.mark.parametrize(
    "x_dtype, out_dtype", [(torch.float32, torch.float16), (torch.float16, torch.float32)]
)
@pytest.mark.parametrize("shape", [(1, 1), (7, 123), (2, 3, 1500)])
def test_rms_norm_out_dtype_rounds_once_and_keeps_dx_in_x_dtype(shape, x_dtype, out_dtype):
    x = leaf(torch.randn(shape).to(x_dtype))
    w = leaf(torch.randn(shape[-1]).to(x_dtype))
    y = rms_norm(x, w, out_dtype=out_dtype)
    dy = torch.randn(shape).to(out_dtype)  # what the next layer sends back: in y's dtype
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    xr, wr = f64(x), f64(w)
    yr = rms_norm_ref(xr, wr)
    dxr, dwr = torch.autograd.grad(yr, (xr, wr), dy.double())
    assert y.dtype == out_dtype and dx.dtype == x_dtype and dw.dtype == x_dtype
    tol = max(TOL[x_dtype], TOL[out_dtype])
    dx_terms = (dy.double() * wr.detach() / xr.detach().pow(2).mean(-1, keepdim=True).sqrt()).norm().item()
    assert rel_err(y, yr) < tol and rel_err(dx, dxr, scale=dx_terms) < tol and rel_err(dw, dwr) < tol
    if x_dtype == torch.float32:  # float32 y cast afterwards (what autocast does) is the same rounding
        assert torch.equal(y, rms_norm(x, w).to(out_dtype))


def test_rms_norm_module_matches_torch_nn_rms_norm():
    x = torch.randn(2, 3, 40)
    for affine in (True, False):
        ours = RMSNorm(40, elementwise_affine=affine)
        torchs = torch.nn.RMSNorm(40, elementwise_affine=affine, dtype=torch.float64)
        assert (ours.weight is None) == (torchs.weight is None) == (not affine)
        if affine:
            ours.weight.data.normal_()
            torchs.weight.data.copy_(ours.weight.data)
        assert ours.normalized_shape == torchs.normalized_shape == (40,)
        assert rel_err(ours(x), torchs(x.double())) < FP32_TOL  # torch's float64 module on float64 x
    # eps=None: torch.nn.RMSNorm takes the eps of its compute dtype, float32 for fp16 input (not
    # fp16's 9.8e-4, which would dominate mean(x**2) = 1e-4 here); a 1-tuple shape; dtype.
    ours = RMSNorm((40,), eps=None, dtype=torch.float16)
    torchs = torch.nn.RMSNorm((40,), eps=None, dtype=torch.float16)
    assert ours.weight.dtype == torch.float16
    xh = (torch.randn(4, 40) * 1e-2).half()
    want = rms_norm_ref(xh.double(), eps=torch.finfo(torch.float32).eps)
    assert rel_err(ours(xh), want) < FP16_TOL and rel_err(torchs(xh), want) < FP16_TOL
    gemma = RMSNorm(40, offset=1.0)
    assert torch.all(gemma.weight == 0)  # offset + weight starts at 1
    assert rel_err(gemma(x), rms_norm_ref(x.double())) < FP32_TOL
    assert RMSNorm(40, 1e-5).eps == 1e-5  # the old (hidden_size, eps) positional form still works


def test_rms_norm_bad_options_name_the_argument():
    x = torch.randn(4, 16)
    with pytest.raises(ValueError, match="^offset: .*needs a weight"):
        rms_norm(x, None, offset=1.0)
    with pytest.raises(ValueError, match="^offset"):
        rms_norm(x, torch.ones(16), offset=float("nan"))
    with pytest.raises(ValueError, match="^weight"):
        rms_norm(x, torch.ones(16, dtype=torch.float64))
    with pytest.raises(ValueError, match="^eps"):
        rms_norm(x, eps=-1.0)
    with pytest.raises(ValueError, match="^out_dtype"):
        rms_norm(x, out_dtype=torch.int8)
    with pytest.raises(ValueError, match="^normalized_shape"):
        RMSNorm((4, 16))
    with pytest.raises(ValueError, match="^offset"):
        RMSNorm(16, elementwise_affine=False, offset=1.0)


# -------------------------------------------------------------------------------------------------- GEGLU
def geglu_ref(gate, up):
    return F.gelu(gate, approximate="tanh") * up


@pytest.mark.parametrize("shape", [(1, 1), (7, 123), (3, 1500), (2, 4097)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_geglu_matches_float64(shape, dtype):
    gate, up = leaf((3 * torch.randn(shape)).to(dtype)), leaf(torch.randn(shape).to(dtype))
    y = geglu(gate, up)
    dy = torch.randn(shape).to(dtype)
    dg, du = torch.autograd.grad(y, (gate, up), dy)
    gr, ur = f64(gate), f64(up)
    yr = geglu_ref(gr, ur)
    dgr, dur = torch.autograd.grad(yr, (gr, ur), dy.double())
    for name, got, ref in (("y", y, yr), ("dgate", dg, dgr), ("dup", du, dur)):
        assert got.dtype == dtype, name
        # the left tail of gelu: tiny outputs, measured against 1% of the inputs' size (as for gelu)
        assert rel_err(got, ref, scale=0.01 * ref.detach().abs().max().item()) < TOL[dtype], name


def test_geglu_module_chunked_views_and_zero_stride_grad():
    gate_up = leaf(torch.randn(7, 2 * 123).half())
    y = GEGLU()(gate_up)  # non-contiguous halves of one projection
    y.sum().backward()  # expanded upstream gradient
    ref_in = f64(gate_up)
    yr = geglu_ref(*ref_in.chunk(2, dim=-1))
    yr.sum().backward()
    assert y.shape == (7, 123)
    assert rel_err(y, yr) < FP16_TOL and rel_err(gate_up.grad, ref_in.grad) < FP16_TOL


def test_geglu_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="^up: shape"):
        geglu(torch.randn(3, 4), torch.randn(3, 5))
    with pytest.raises(ValueError, match="^up: dtype"):
        geglu(torch.randn(3, 4), torch.randn(3, 4).half())
    with pytest.raises(ValueError, match="^gate: unsupported dtype"):
        geglu(torch.arange(4), torch.arange(4))
