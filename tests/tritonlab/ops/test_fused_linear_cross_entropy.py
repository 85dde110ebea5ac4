"""fused_linear_cross_entropy against ``F.cross_entropy(F.linear(x, W, b).double(), ...)`` in float64.

CPU (Triton interpreter, fp32 and fp16; the interpreter's bf16 dot is not trusted): odd shapes -- one
token, every token ignored, vocabularies that end in a partial block (the interpreter's blocks are
512 float32 / 1024 float16 logits), prime hidden sizes, token counts that are not a multiple of the
chunk, 3-D x -- under every reduction with and without bias, label smoothing and softcap, gradients
for x, weight and bias; the caller's tensors untouched; each bad input a ``ValueError`` naming the
argument; ``torch.compile(fullgraph=True)`` through the custom op.

GPU (``@pytest.mark.gpu``): bf16 and fp32 at 4096 x 4096 x 32 000 against float64, and peak memory at
(8192, 4096, 128 256) well under the logits' size.

Tolerances: fp32 1e-5 norm-wise (measured ~3e-7); fp16 rounds x W^T, the logits' gradient and the
products to 11 bits: 2e-3 (measured ~4e-4).
"""

import pytest
import torch
import torch.nn.functional as F

from tritonlab.ops import FusedLinearCrossEntropyLoss, fused_linear_cross_entropy
from tritonlab.ops.fused_linear_cross_entropy import DEFAULT_CHUNK_BYTES, _scale_unless_one_, chunk_rows_for
from tritonlab.testing import rel_err

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
IGNORE = -100


def reference(
    x, weight, target, bias=None, ignore_index=IGNORE, reduction="mean", label_smoothing=0.0, softcap=None
):
    z = F.linear(x, weight, bias)
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    loss = F.cross_entropy(
        z.reshape(-1, z.shape[-1]),
        target.reshape(-1),
        ignore_index=ignore_index,
        reduction=reduction,
        label_smoothing=label_smoothing,
    )
    return loss.view(target.shape) if reduction == "none" else loss


def make(tokens_shape, hidden, vocab, dtype, bias=True, seed=0, device="cpu"):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(*tokens_shape, hidden, generator=gen).to(device, dtype)
    weight = (torch.randn(vocab, hidden, generator=gen) / hidden**0.5 * 2).to(device, dtype)
    b = torch.randn(vocab, generator=gen).to(device, dtype) if bias else None
    target = torch.randint(0, vocab, tokens_shape, generator=gen).to(device)
    flat = target.view(-1)
    if flat.numel() > 2:
        flat[1] = IGNORE
    return x, weight, b, target


def check(x, weight, bias, target, upstream, tol, **kwargs):
    """Loss and the gradients of x, weight (and bias) against float64; returns our gradients."""
    leaves = [t.detach().clone().requires_grad_() for t in (x, weight, bias) if t is not None]
    xs, ws, bs = (*leaves, None)[:3]
    before = [t.detach().clone() for t in (*leaves, target)]
    loss = fused_linear_cross_entropy(xs, ws, target, bs, **kwargs)
    grads = torch.autograd.grad(loss, leaves, upstream)
    # The tensors passed in are untouched (the gradient overwrites only the op's own logits buffer).
    for t, b in zip((*leaves, target), before, strict=True):
        assert torch.equal(t.detach(), b)

    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    xr, wr, br = (*ref_leaves, None)[:3]
    ref = reference(xr, wr, target, br, **{k: v for k, v in kwargs.items() if k != "chunk_rows"})
    ref_grads = torch.autograd.grad(ref, ref_leaves, upstream.double())

    assert loss.dtype == x.dtype and loss.shape == ref.shape
    assert rel_err(loss, ref) < tol, ("loss", rel_err(loss, ref))
    for name, g, r, leaf in zip(("x", "weight", "bias"), grads, ref_grads, leaves, strict=False):
        assert g.dtype == leaf.dtype and g.shape == leaf.shape, name
        assert torch.isfinite(g).all(), name
        assert rel_err(g, r) < tol, (name, rel_err(g, r), tol)
    return grads


OPTIONS = {
    "plain": {},
    "smoothing": dict(label_smoothing=0.2),
    "softcap": dict(softcap=3.0),
    "both": dict(label_smoothing=0.1, softcap=5.0),
}
# (leading shape of x, hidden, vocab, chunk_rows)
SHAPES = {
    "one-token": ((1,), 13, 301, None),
    "7-tokens-chunk-3": ((7,), 17, 1500, 3),  # 3 + 3 + 1; 1500 = 2 float32 blocks + a partial one
    "3d-default-chunk": ((2, 9), 31, 129, None),  # default chunk: 8 KiB of logits, 15 / 31 rows
    "chunk-bigger-than-tokens": ((5,), 7, 1025, 64),
}


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_matches_float64(shape, dtype, reduction, option):
    lead, hidden, vocab, chunk = SHAPES[shape]
    with_bias = option != "softcap"  # with and without a bias
    x, weight, bias, target = make(lead, hidden, vocab, dtype, bias=with_bias)
    upstream = (torch.tensor(2.5) if reduction != "none" else torch.randn(lead)).to(dtype)
    grads = check(
        x,
        weight,
        bias,
        target,
        upstream,
        TOL[dtype],
        reduction=reduction,
        chunk_rows=chunk,
        **OPTIONS[option],
    )
    if target.numel() > 2:  # the ignored token gets no gradient
        assert torch.all(grads[0].reshape(-1, hidden)[1] == 0)


def test_chunk_sizes_agree():
    """The same loss and gradients for every chunk size, down to one row a chunk."""
    x, weight, bias, target = make((11,), 5, 97, torch.float32)
    up = torch.tensor(1.0)
    results = [check(x, weight, bias, target, up, TOL[torch.float32], chunk_rows=c) for c in (1, 4, 11, 100)]
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert rel_err(a, b) < 1e-6


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_all_tokens_ignored(reduction):
    """As in PyTorch: the mean is NaN (0/0), the sum 0, each token 0; every gradient exactly 0."""
    x, weight, bias, _ = make((4,), 11, 60, torch.float32)
    target = torch.full((4,), IGNORE)
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    loss = fused_linear_cross_entropy(*leaves[:2], target, leaves[2], reduction=reduction, chunk_rows=3)
    grads = torch.autograd.grad(loss.sum(), leaves)
    if reduction == "mean":
        assert torch.isnan(loss)
    else:
        assert torch.equal(loss, torch.zeros_like(loss))
    for g in grads:
        assert torch.equal(g, torch.zeros_like(g))


def test_custom_ignore_index_int32_target_and_module():
    x, weight, bias, target = make((6,), 9, 40, torch.float32)
    target = target.to(torch.int32)
    target[1], target[3] = 2, 7  # -100 is a class index out of range once 7 is the ignored one
    module = FusedLinearCrossEntropyLoss(ignore_index=7, label_smoothing=0.05, chunk_rows=4)
    loss = module(x, weight, target, bias)
    ref = reference(
        x.double(), weight.double(), target.long(), bias.double(), ignore_index=7, label_smoothing=0.05
    )
    assert rel_err(loss, ref) < TOL[torch.float32]


def test_partial_gradients_and_no_grad():
    """A frozen weight (only x trains), a frozen x, and no autograd at all give the same loss."""
    x, weight, bias, target = make((5,), 8, 50, torch.float32)
    ref = reference(x.double(), weight.double(), target, bias.double())
    with torch.no_grad():
        assert rel_err(fused_linear_cross_entropy(x, weight, target, bias), ref) < 1e-5
    xs = x.clone().requires_grad_()
    loss = fused_linear_cross_entropy(xs, weight, target, bias, chunk_rows=2)
    loss.backward()
    xr = x.double().requires_grad_()
    reference(xr, weight.double(), target, bias.double()).backward()
    assert rel_err(xs.grad, xr.grad) < 1e-5
    ws = weight.clone().requires_grad_()
    fused_linear_cross_entropy(x, ws, target, chunk_rows=2).backward()
    wr = weight.double().requires_grad_()
    reference(x.double(), wr, target).backward()
    assert rel_err(ws.grad, wr.grad) < 1e-5


def test_second_backward_is_refused():
    x, weight, _, target = make((3,), 4, 20, torch.float32, bias=False)
    x.requires_grad_()
    loss = fused_linear_cross_entropy(x, weight, target)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()


def test_chunk_rows_for_bounds_the_chunk_bytes():
    for n, v, size in [(1, 300, 4), (100, 129, 2), (16384, 128256, 2), (5, 10**6, 4)]:
        rows = chunk_rows_for(n, v, size)
        assert 1 <= rows <= max(n, 1)
        assert rows == 1 or rows * v * size <= DEFAULT_CHUNK_BYTES
    assert chunk_rows_for(16384, 128256, 2, chunk_bytes=2**30) * 128256 * 2 <= 2**30


def test_torch_compile_fullgraph():
    """The custom op traces under torch.compile(fullgraph=True) (Inductor on the CPU), forward and
    backward, with ops around it; the same values as eager."""
    x, weight, bias, target = make((2, 3), 16, 70, torch.float32)
    proj = torch.randn(16, 16) / 4

    def step(x, proj, weight, bias, target):
        h = torch.tanh(x @ proj)
        return fused_linear_cross_entropy(h, weight, target, bias, label_smoothing=0.1) * 2.0

    results = []
    for fn in (step, torch.compile(step, fullgraph=True)):
        leaves = [t.clone().requires_grad_() for t in (x, proj, weight, bias)]
        loss = fn(leaves[0], leaves[1], leaves[2], leaves[3], target)
        results.append([loss, *torch.autograd.grad(loss, leaves)])
    for a, b in zip(*results, strict=True):
        assert rel_err(a, b) < 1e-5


def test_target_out_of_range():
    x, weight, _, target = make((4,), 6, 30, torch.float32, bias=False)
    for bad in (30, -3):
        t = target.clone()
        t[2] = bad
        with pytest.raises(ValueError, match=f"^target: value {bad} is outside"):
            fused_linear_cross_entropy(x, weight, t)


def _bad_inputs():
    x, w, b, t = make((4,), 6, 30, torch.float32)
    return [
        (dict(x=x.numpy()), "^x: expected a torch.Tensor"),
        (dict(x=x.long()), "^x: unsupported dtype"),
        (dict(weight=w[:, :5]), "^weight: expected \\(vocab, 6\\)"),
        (dict(weight=w[0]), "^weight: expected 2 dimensions"),
        (dict(weight=w.half()), "^weight: dtype"),
        (dict(bias=b[:7]), "^bias: expected shape \\(30,\\)"),
        (dict(bias=b.half()), "^bias: dtype"),
        (dict(bias=b[None]), "^bias: expected 1 dimensions"),
        (dict(target=t.float()), "^target: expected an int64 or int32"),
        (dict(target=t[:3]), "^target: expected shape \\(4,\\)"),
        (dict(target=t[None]), "^target: expected shape"),
        (dict(reduction="avg"), "^reduction"),
        (dict(ignore_index=1.5), "^ignore_index"),
        (dict(label_smoothing=1.5), "^label_smoothing"),
        (dict(label_smoothing=-0.1), "^label_smoothing"),
        (dict(softcap=0.0), "^softcap"),
        (dict(softcap=float("inf")), "^softcap"),
        (dict(chunk_rows=0), "^chunk_rows"),
        (dict(chunk_rows=2.0), "^chunk_rows"),
    ], dict(x=x, weight=w, bias=b, target=t)


@pytest.mark.parametrize("index", range(len(_bad_inputs()[0])))
def test_bad_input_names_the_argument(index):
    cases, good = _bad_inputs()
    change, match = cases[index]
    with pytest.raises(ValueError, match=match):
        fused_linear_cross_entropy(**{**good, **change})


# ------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_matches_float64(dtype):
    """4096 tokens x 4096 x 32 000, four chunks of 1024, against float64 on the GPU."""
    x, weight, bias, target = make((4096,), 4096, 32000, dtype, bias=False, device="cuda")
    target[::7] = IGNORE
    tol = 1e-4 if dtype == torch.float32 else TOL[dtype]
    check(x, weight, None, target, torch.tensor(1.0, device="cuda"), tol, chunk_rows=1024)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,vocab", [(8192, 128256), (4096, 32000)])
def test_gpu_peak_memory_never_holds_the_logits(tokens, vocab):
    """Forward and backward in bf16 (the default chunk at 128 256 classes, 512 rows at 32 000): the
    memory over the inputs, less x's and the weight's gradients, stays under half the bf16 logits, and
    at 128 256 classes all of it stays under 2 GiB (the issue's goal). At 4096 x 32 000 the weight's
    gradient alone is as large as the bf16 logits, so only the memory beyond the gradients is bounded."""
    x, weight, _, target = make((tokens,), 4096, vocab, torch.bfloat16, bias=False, device="cuda")
    x.requires_grad_()
    weight.requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    chunk = chunk_rows_for(tokens, vocab, 2) if vocab > 100000 else 512
    fused_linear_cross_entropy(x, weight, target, chunk_rows=chunk).backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - start
    # Beyond x.grad and weight.grad themselves, well under even the bf16 logits.
    beyond_grads = peak - (x.numel() + weight.numel()) * 2
    logits_bf16 = tokens * vocab * 2
    assert beyond_grads < logits_bf16 / 2, (beyond_grads / 2**30, logits_bf16 / 2**30)
    if vocab > 100000:
        assert peak < 2.0 * 2**30, peak / 2**30


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph():
    x, weight, bias, target = make((2, 64), 256, 1000, torch.bfloat16, device="cuda")

    def step(x, weight, bias, target):
        return fused_linear_cross_entropy(x, weight, target, bias, softcap=30.0)

    results = []
    for fn in (step, torch.compile(step, fullgraph=True)):
        leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
        loss = fn(*leaves, target)
        results.append([loss, *torch.autograd.grad(loss, leaves)])
    for a, b in zip(*results, strict=True):
        assert rel_err(a, b) < 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 4097, 3 * 4096 + 5])
@pytest.mark.parametrize("g", [1.0, 2.5, -0.5, 0.0])
def test_scale_unless_one(n, dtype, g):
    """The backward's in-place scale: t * g rounded once to t's dtype (within one bf16 ulp: the
    interpreter rounds float32 to bf16 toward zero, the GPU to nearest), t unchanged for g = 1, over
    rows longer than one block."""
    t = torch.randn(n, dtype=torch.float32).to(dtype)
    before = t.clone()
    expected = (t.float() * g).to(dtype)
    _scale_unless_one_(t, torch.tensor(g))
    if g == 1.0 or dtype != torch.bfloat16:
        assert torch.equal(t, before if g == 1.0 else expected)
    else:
        torch.testing.assert_close(t, expected, rtol=2**-7, atol=0)


def test_scale_unless_one_strided():
    """A non-contiguous tensor takes torch's multiply and gets the same result."""
    base = torch.randn(6, 10)
    t = base.t()
    expected = t * 3.0
    _scale_unless_one_(t, torch.tensor(3.0))
    assert torch.equal(t, expected) and torch.equal(base.t(), expected)
