"""tritonlab.ops' direct launches on the GPU: a stale key would launch another call's binary.

On a GPU each op's kernels are compiled at the first call of a signature and launched directly
afterwards with the arguments ``tritonlab._launch.launch`` kept; the scalars (eps, ignore_index, the
smoothing, n_rows ...) and constexprs are baked into what is kept. So each test here runs an op's
cases twice over, in alternation -- cases that differ in one scalar only, in width at the same block
size, in rows at the same grid, in strides, dtype or options -- and checks every call against a
float64 reference: a case that wrongly reused another's launch fails where it does.

Tolerances as in test_ops_gpu.py: float32 1e-5 (5e-5 for cross-entropy's long sums of the GPU's
approximate exp), float16 inputs 2e-3 (11 significant bits).
"""

import pytest
import torch
import torch.nn.functional as F

from tritonlab.ops import (
    cross_entropy,
    dequantize_fp8,
    fused_linear_cross_entropy,
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
DEVICE = "cuda"
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}
CE_TOL = 5e-5


def randn(*shape, scale=1.0, dtype=torch.float32):
    return (scale * torch.randn(*shape, device=DEVICE)).to(dtype)


def leaf64(t):
    return t.detach().double().requires_grad_()


def alternate(cases: dict, check) -> None:
    """Every case, then every case again: each call follows one of another signature or scalars."""
    for _ in range(2):
        for name, case in cases.items():
            check(name, **case)


def test_rms_norm_alternating_eps_widths_rows_strides_and_options():
    wide = randn(64, 1024, scale=1e-3)

    def check(name, x, eps=1e-6, weight=True, offset=0.0, out_dtype=None):
        # x ~ 1e-3, mean(x**2) ~ 1e-6: eps 1e-5 against 1e-6 changes the result 2.3-fold.
        x = x.detach().requires_grad_()  # a view keeps its strides
        w = (1 + 0.1 * randn(x.shape[-1])).requires_grad_() if weight else None
        y = rms_norm(x, w, eps=eps, offset=offset, out_dtype=out_dtype)
        dy = randn(*x.shape).to(y.dtype)
        leaves = [x] if w is None else [x, w]
        grads = torch.autograd.grad(y, leaves, dy)
        refs = [leaf64(t) for t in leaves]
        xr = refs[0]
        yr = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + eps)
        if w is not None:
            yr = yr * (offset + refs[1])
        grads_ref = torch.autograd.grad(yr, refs, dy.double())
        tol = TOL[torch.float16 if torch.float16 in (x.dtype, y.dtype) else torch.float32]
        for what, got, ref in zip(["y", "dx", "dw"], [y, *grads], [yr, *grads_ref], strict=False):
            assert rel_err(got, ref) < tol, (name, what, rel_err(got, ref))

    x = randn(64, 1000, scale=1e-3)
    alternate(
        {
            "eps 1e-6": {"x": x},
            "eps 1e-5": {"x": x, "eps": 1e-5},
            "63 rows, same grid": {"x": x[:63]},
            "width 1024, same block": {"x": wide},
            "row stride 1024": {"x": wide[:, :1000]},
            "no weight": {"x": x, "weight": False},
            "offset 1": {"x": x, "offset": 1.0},
            "float16 x": {"x": x.half()},
            "float16 y": {"x": x, "out_dtype": torch.float16},
        },
        check,
    )


# Each activation and its float64 reference.
ACTIVATIONS = {
    "gelu erf": (lambda x: gelu(x, "none"), lambda x: F.gelu(x)),
    "gelu tanh": (lambda x: gelu(x, "tanh"), lambda x: F.gelu(x, approximate="tanh")),
    "swiglu": (swiglu, lambda g, u: F.silu(g) * u),
    "geglu": (geglu, lambda g, u: F.gelu(g, approximate="tanh") * u),
}


def test_activations_alternating_kernels_sizes_and_dtypes():
    def check(name, op, n, dtype=torch.float32):
        fn, ref_fn = ACTIVATIONS[op]
        inputs = [randn(n, scale=3.0, dtype=dtype).requires_grad_() for _ in range(1 if "gelu" in op else 2)]
        y = fn(*inputs)
        dy = randn(n, dtype=dtype)
        grads = torch.autograd.grad(y, inputs, dy)
        refs = [leaf64(t) for t in inputs]
        yr = ref_fn(*refs)
        grads_ref = torch.autograd.grad(yr, refs, dy.double())
        for got, ref in zip([y, *grads], [yr, *grads_ref], strict=True):
            # gelu's left tail: tiny values, measured against 1% of the largest
            assert rel_err(got, ref, scale=0.01 * ref.detach().abs().max().item()) < TOL[dtype], name

    alternate(
        {
            "gelu erf": {"op": "gelu erf", "n": 12288},
            "gelu tanh": {"op": "gelu tanh", "n": 12288},
            "gelu, same grid": {"op": "gelu erf", "n": 12281},
            "gelu float16": {"op": "gelu tanh", "n": 12288, "dtype": torch.float16},
            "swiglu": {"op": "swiglu", "n": 12288},
            "geglu": {"op": "geglu", "n": 12288},
            "swiglu, same grid": {"op": "swiglu", "n": 12281},
        },
        check,
    )


def test_rope_alternating_heads_head_dims_and_strided_views():
    def check(name, batch, seq, heads, k_heads, d, fused=False):
        if fused:  # q and k slices of one (B, T, 3, H, D) projection: strided views
            qkv = randn(batch, seq, 3, heads, d).requires_grad_()
            q, k = qkv[:, :, 0], qkv[:, :, 1, :k_heads]
            leaves = [qkv]
        else:
            q, k = (
                randn(batch, seq, heads, d).requires_grad_(),
                randn(batch, seq, k_heads, d).requires_grad_(),
            )
            leaves = [q, k]
        cos, sin = rope_cache(seq + 5, d)  # more positions than used
        qo, ko = rope(q, k, cos, sin)
        dq, dk = randn(*qo.shape), randn(*ko.shape)
        grads = torch.autograd.grad((qo, ko), leaves, (dq, dk))
        refs = [leaf64(t) for t in leaves]
        qr, kr = (refs[0][:, :, 0], refs[0][:, :, 1, :k_heads]) if fused else refs
        c, s = cos[:seq].double()[None, :, None, :], sin[:seq].double()[None, :, None, :]

        def rot(x):
            x1, x2 = x[..., : d // 2], x[..., d // 2 :]
            return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

        qor, kor = rot(qr), rot(kr)
        grads_ref = torch.autograd.grad((qor, kor), refs, (dq.double(), dk.double()))
        for got, ref in zip([qo, ko, *grads], [qor, kor, *grads_ref], strict=True):
            assert rel_err(got, ref) < TOL[torch.float32], name

    alternate(
        {
            "4 and 2 heads": {"batch": 2, "seq": 16, "heads": 4, "k_heads": 2, "d": 64},
            "8 and 8 heads": {"batch": 2, "seq": 16, "heads": 8, "k_heads": 8, "d": 64},
            "head dim 32": {"batch": 2, "seq": 16, "heads": 4, "k_heads": 2, "d": 32},
            "3 positions more": {"batch": 2, "seq": 19, "heads": 4, "k_heads": 2, "d": 64},
            "fused QKV views": {"batch": 2, "seq": 16, "heads": 4, "k_heads": 2, "d": 64, "fused": True},
        },
        check,
    )


def ce_reference(logits, target, ignore_index, reduction, weight, label_smoothing, softcap, lse_square_scale):
    """F.cross_entropy of the (softcapped) logits, plus the z-loss per counted token."""
    z = logits if softcap is None else softcap * torch.tanh(logits / softcap)
    loss = F.cross_entropy(
        z,
        target,
        weight=weight,
        ignore_index=ignore_index,
        reduction=reduction,
        label_smoothing=label_smoothing,
    )
    counted = target != ignore_index
    zl = lse_square_scale * torch.logsumexp(z, -1) ** 2 * counted
    if reduction == "none":
        return loss + zl
    return loss + (zl.sum() / counted.sum() if reduction == "mean" else zl.sum())


def test_cross_entropy_alternating_scalars_options_and_shapes():
    wide = randn(64, 1100, scale=4.0)

    def check(name, logits, ignore_index=5, reduction="mean", weight=False, **options):
        rows, vocab = logits.shape
        target = torch.randint(0, vocab, (rows,), device=DEVICE)
        target[::7], target[3::7] = 5, 7  # ignore_index 5 or 7: the other is an ordinary class
        logits = logits.detach().requires_grad_()
        kwargs = {"weight": None, "label_smoothing": 0.0, "softcap": None, "lse_square_scale": 0.0, **options}
        if weight:
            kwargs["weight"] = 0.5 + torch.rand(vocab, device=DEVICE)
        loss = cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction, **kwargs)
        upstream = randn(*loss.shape) if reduction == "none" else torch.tensor(2.5, device=DEVICE)
        (grad,) = torch.autograd.grad(loss, logits, upstream)
        ref = leaf64(logits)
        ref_kwargs = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        loss_ref = ce_reference(ref, target, ignore_index, reduction, **ref_kwargs)
        (grad_ref,) = torch.autograd.grad(loss_ref, ref, upstream.double())
        assert rel_err(loss, loss_ref) < CE_TOL, (name, rel_err(loss, loss_ref))
        assert rel_err(grad, grad_ref) < CE_TOL, (name, rel_err(grad, grad_ref))

    logits = randn(64, 1000, scale=4.0)
    alternate(
        {
            "ignore 5": {"logits": logits},
            "ignore 7": {"logits": logits, "ignore_index": 7},
            "sum": {"logits": logits, "reduction": "sum"},
            "none": {"logits": logits, "reduction": "none"},
            "vocab 1003, same block": {"logits": randn(64, 1003, scale=4.0)},
            "63 rows": {"logits": logits[:63]},
            "row stride 1100": {"logits": wide[:, :1000]},
            "smoothing 0.1": {"logits": logits, "label_smoothing": 0.1},
            "smoothing 0.2": {"logits": logits, "label_smoothing": 0.2},
            "softcap 30": {"logits": logits, "softcap": 30.0},
            "softcap 10": {"logits": logits, "softcap": 10.0},
            "smoothing and softcap": {"logits": logits, "label_smoothing": 0.1, "softcap": 10.0},
            "class weights (Triton's launcher)": {"logits": logits, "weight": True},
            "z-loss (Triton's launcher)": {"logits": logits, "lse_square_scale": 1e-2},
        },
        check,
    )


def test_fp8_alternating_granularity_block_widths_and_dtypes():
    def check(name, x, granularity, block=128):
        q, scales = quantize_fp8(x, granularity, block)
        width = x.shape[-1] if granularity == "row" else block
        groups = x.double().view(x.shape[0], -1, width)
        expected = groups.abs().amax(-1) / 448
        assert rel_err(scales, expected.view(scales.shape)) < 2e-7, name
        quotient = (x.float() * (1 / scales).repeat_interleave(width, -1)).clamp(-448, 448)
        same = (
            (q.view(torch.uint8) == quotient.to(torch.float8_e4m3fn).view(torch.uint8)).float().mean().item()
        )
        assert same > 0.999, name  # the GPU's 1/scale may differ from PyTorch's in the last bit
        y = dequantize_fp8(q, scales, granularity, block, dtype=torch.float32)
        y_ref = q.double() * scales.double().repeat_interleave(width, -1)
        assert rel_err(y, y_ref) < 1e-7, name

    x = randn(16, 1024, scale=5.0)
    alternate(
        {
            "rows": {"x": x, "granularity": "row"},
            "rows of 1000": {"x": x[:, :1000].contiguous(), "granularity": "row"},
            "row stride 1024": {"x": x[:, :1000], "granularity": "row"},
            "blocks of 128": {"x": x, "granularity": "block"},
            "blocks of 64": {"x": x, "granularity": "block", "block": 64},
            "float16 blocks": {"x": x.half(), "granularity": "block"},
        },
        check,
    )


def test_fused_linear_cross_entropy_alternating_scalars_and_chunks():
    hidden, vocab, tokens = 32, 1000, 64
    x, weight = randn(tokens, hidden), randn(vocab, hidden, scale=2 / hidden**0.5)

    def check(name, ignore_index=5, chunk_rows=16, **options):
        target = torch.randint(0, vocab, (tokens,), device=DEVICE)
        target[::7], target[3::7] = 5, 7
        leaves = [x.clone().requires_grad_(), weight.clone().requires_grad_()]
        loss = fused_linear_cross_entropy(
            *leaves, target, ignore_index=ignore_index, chunk_rows=chunk_rows, **options
        )
        grads = torch.autograd.grad(loss, leaves)
        refs = [leaf64(t) for t in leaves]
        loss_ref = ce_reference(
            F.linear(*refs), target, ignore_index, options.get("reduction", "mean"), None,
            options.get("label_smoothing", 0.0), options.get("softcap"), 0.0,
        )  # fmt: skip
        grads_ref = torch.autograd.grad(loss_ref, refs)
        for got, ref in zip([loss, *grads], [loss_ref, *grads_ref], strict=True):
            assert rel_err(got, ref) < CE_TOL, (name, rel_err(got, ref))

    alternate(
        {
            "ignore 5": {},
            "ignore 7": {"ignore_index": 7},
            "chunks of 18": {"chunk_rows": 18},  # the second chunk's loss rows 8 bytes off 16
            "sum": {"reduction": "sum"},
            "smoothing 0.1": {"label_smoothing": 0.1},
            "smoothing 0.2": {"label_smoothing": 0.2},
            "softcap 10": {"softcap": 10.0},
        },
        check,
    )
