"""FlashAttention-2, PyTorch and Triton: O, L and dQ/dK/dV against a float64 reference.

CPU: the PyTorch version directly, the Triton kernels in the interpreter in fp32/fp16 (its tl.dot
on bf16 is not trustworthy). GPU: the compiled kernels in bf16 on block-crossing shapes -- the
Triton kernels and, on Hopper, the Gluon ones ``impl="auto"`` takes there -- and in float32 against
float64 at a float32 tolerance. Outputs are poisoned with NaN before each run, so a tile the kernel
never writes shows up.
"""

import pytest
import torch

from tritonlab._runtime import kernel_device_type
from tritonlab.attention import (
    FlashAttentionPyTorch,
    FlashAttentionTriton,
    TileConfig,
    attention_flops,
    causal_mask,
    flash2,
    naive_attention,
    reference_attention,
)
from tritonlab.attention.flash2 import _GPU_CONFIGS, _table_config, flash_backward, flash_forward
from tritonlab.testing import poisoned_empty, same_layout_leaf

DEVICE = kernel_device_type()
GPU = DEVICE == "cuda"
HOPPER = GPU and torch.cuda.get_device_capability()[0] == 9
TOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def make_inputs(batch, n_q, n_k, head_dim, dtype, device=DEVICE, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    make = lambda n: torch.randn(batch, n, head_dim, generator=gen, device=device, dtype=dtype)  # noqa: E731
    return make(n_q), make(n_k), make(n_k), make(n_q)


def reference_grads(q, k, v, grad_out, is_causal):
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o, lse = reference_attention(q64, k64, v64, is_causal=is_causal)
    return o.detach(), lse, torch.autograd.grad(o, (q64, k64, v64), grad_out.double())


def assert_close(name, got, want, tol):
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol, msg=lambda m: f"{name}: {m}")


def lse_of(output):
    """L as the forward saved it: the only saved tensor of shape (B, Nq)."""
    saved = [t for t in output.grad_fn.saved_tensors if t.shape == output.shape[:2]]
    assert len(saved) == 1, [tuple(t.shape) for t in output.grad_fn.saved_tensors]
    return saved[0]


def check_function(fn, q, k, v, grad_out, is_causal, tol, *options):
    o_ref, lse_ref, grads_ref = reference_grads(q, k, v, grad_out, is_causal)
    q, k, v = (same_layout_leaf(t) for t in (q, k, v))
    with poisoned_empty():
        o = fn.apply(q, k, v, is_causal, *options)
        lse = lse_of(o)
        grads = torch.autograd.grad(o, (q, k, v), grad_out)
    assert o.shape == q.shape and o.dtype == q.dtype
    assert_close("O", o, o_ref, tol)
    assert_close("L", lse, lse_ref, tol)
    for name, got, want, inp in zip(("dQ", "dK", "dV"), grads, grads_ref, (q, k, v), strict=True):
        assert got.shape == inp.shape and got.dtype == inp.dtype
        assert_close(name, got, want, tol)


# --- the PyTorch version -----------------------------------------------------------------------

LENGTHS = [(1, 1), (17, 17), (100, 100), (17, 100), (100, 17), (1, 33)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q,n_k", LENGTHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pytorch_matches_reference(n_q, n_k, causal, dtype):
    q, k, v, grad_out = make_inputs(2, n_q, n_k, 24, dtype, device="cpu", seed=n_q * 1000 + n_k)
    check_function(FlashAttentionPyTorch, q, k, v, grad_out, causal, TOL[dtype])


def test_pytorch_gradcheck_float64():
    q, k, v, _ = make_inputs(1, 6, 9, 4, torch.float64, device="cpu")
    for causal in (False, True):
        inputs = tuple(t.clone().requires_grad_() for t in (q, k, v))
        assert torch.autograd.gradcheck(
            lambda a, b, c, causal=causal: FlashAttentionPyTorch.apply(a, b, c, causal), inputs
        )


def test_pytorch_uses_tiles():
    """The forward really is tiled: lengths below one tile and above several give the same answer."""
    assert FlashAttentionPyTorch.Q_TILE >= 16 and FlashAttentionPyTorch.K_TILE >= 16
    q, k, v, _ = make_inputs(1, 3 * FlashAttentionPyTorch.Q_TILE + 5, 70, 16, torch.float32, device="cpu")
    assert_close(
        "O", FlashAttentionPyTorch.apply(q, k, v, True), reference_attention(q, k, v, is_causal=True)[0], 1e-5
    )


def test_naive_attention_matches_reference():
    q, k, v, _ = make_inputs(2, 33, 47, 16, torch.float64, device="cpu")
    assert_close("naive", naive_attention(q, k, v), reference_attention(q, k, v)[0], 1e-9)
    causal = naive_attention(q, k, v, causal_mask(33, 47))
    assert_close("naive causal", causal, reference_attention(q, k, v, is_causal=True)[0], 1e-9)


# --- the Triton version: interpreter on the CPU, compiled on the GPU -----------------------------

INTERPRETER_CASES = [
    (1, 1, True),
    (17, 17, False),
    (100, 37, True),
    (37, 100, False),
    (37, 100, True),
    (100, 100, True),
]


@pytest.mark.skipif(GPU, reason="interpreter test (the GPU runs its own)")
@pytest.mark.parametrize("n_q,n_k,causal", INTERPRETER_CASES)
@pytest.mark.parametrize("dtype,head_dim", [(torch.float32, 16), (torch.float16, 32)])
def test_triton_interpreter_matches_reference(n_q, n_k, causal, dtype, head_dim):
    q, k, v, grad_out = make_inputs(2, n_q, n_k, head_dim, dtype, seed=n_q + 7 * n_k)
    check_function(FlashAttentionTriton, q, k, v, grad_out, causal, TOL[dtype])


@pytest.mark.skipif(GPU, reason="interpreter test")
@pytest.mark.parametrize("head_dim", [64, 128])
def test_triton_interpreter_wide_heads(head_dim):
    q, k, v, grad_out = make_inputs(1, 20, 19, head_dim, torch.float32, seed=head_dim)
    check_function(FlashAttentionTriton, q, k, v, grad_out, True, TOL[torch.float32])


@pytest.mark.skipif(GPU, reason="interpreter test")
def test_triton_interpreter_257_and_strided():
    """The longest odd length, with q, k, v non-contiguous views (as a fused QKV projection gives)."""
    q, k, v = torch.randn(1, 257, 3, 16).unbind(2)
    assert not same_layout_leaf(q).is_contiguous()  # what check_function passes on
    check_function(FlashAttentionTriton, q, k, v, torch.randn(1, 257, 16), True, TOL[torch.float32])


@pytest.mark.skipif(GPU, reason="interpreter test")
@pytest.mark.parametrize("block_m,block_n", [(16, 32), (32, 16)])
def test_triton_unequal_tiles(block_m, block_n):
    """The GPU tiles differ per kernel (e.g. dK/dV with 32 queries x 64 keys): the diagonal and ragged
    tile bookkeeping must hold when BLOCK_M != BLOCK_N too."""
    cfg = TileConfig(block_m, block_n, 4, 1)
    for n_q, n_k, causal in [(50, 50, True), (33, 70, True), (70, 33, True), (45, 45, False)]:
        q, k, v, grad_out = make_inputs(1, n_q, n_k, 16, torch.float32, seed=n_q)
        o_ref, lse_ref, grads_ref = reference_grads(q, k, v, grad_out, causal)
        with poisoned_empty():
            o, lse = flash_forward(q, k, v, causal, config=cfg)
            grads = flash_backward(q, k, v, o, lse, grad_out, causal, dq_config=cfg, dkdv_config=cfg)
        assert_close(f"O {n_q}x{n_k}", o, o_ref, TOL[torch.float32])
        assert_close(f"L {n_q}x{n_k}", lse, lse_ref, TOL[torch.float32])
        for name, got, want in zip(("dQ", "dK", "dV"), grads, grads_ref, strict=True):
            assert_close(f"{name} {n_q}x{n_k}", got, want, TOL[torch.float32])


# Forward only, both loaders: causal and not, odd lengths, Nq != Nk both ways. Batch 3: the causal
# grid runs batch-fastest, so a batch that does not divide the tile count is the test.
FORWARD_LENGTHS = [(1, 1), (17, 17), (100, 100), (17, 100), (100, 17), (1, 257), (257, 1)]


@pytest.mark.skipif(GPU, reason="interpreter test")
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("loader", ["tma", "blockptr"])
def test_triton_interpreter_forward_loaders(loader, causal):
    for n_q, n_k in FORWARD_LENGTHS:
        q, k, v, _ = make_inputs(3, n_q, n_k, 16, torch.float32, seed=n_q + 3 * n_k)
        with poisoned_empty():
            o, lse = flash_forward(q, k, v, causal, config=TileConfig(16, 32, 4, 1), loader=loader)
        o_ref, lse_ref = reference_attention(q, k, v, is_causal=causal)
        assert_close(f"O {n_q}x{n_k}", o, o_ref, TOL[torch.float32])
        assert_close(f"L {n_q}x{n_k}", lse, lse_ref, TOL[torch.float32])


@pytest.mark.skipif(GPU, reason="interpreter test")
def test_triton_interpreter_backward_saturated_scores():
    """Every score near -150 (after scaling), so L is too: the zero rows padding a ragged key tile
    would give P = exp(0 - L) = inf there, and inf x 0 = NaN in dQ, unless that tile is masked."""
    gen = torch.Generator().manual_seed(3)
    q = -6.0 + 0.3 * torch.randn(2, 40, 16, generator=gen)
    k = 6.0 + 0.3 * torch.randn(2, 23, 16, generator=gen)
    v, grad_out = torch.randn(2, 23, 16, generator=gen), torch.randn(2, 40, 16, generator=gen)
    for causal in (False, True):
        check_function(FlashAttentionTriton, q, k, v, grad_out, causal, 1e-3)


def column_major_d(batch, n, head_dim, dtype=torch.float32):
    """(B, N, D) with stride N along D (the transpose of a (B, D, N) buffer): no TMA possible."""
    return torch.randn(batch, head_dim, n, dtype=dtype, device=DEVICE).transpose(1, 2)


@pytest.mark.skipif(GPU, reason="interpreter test")
def test_triton_interpreter_falls_back_to_block_pointers():
    """D not contiguous: "auto" takes block pointers (forward and backward correct), "tma" refuses."""
    q, k, v = column_major_d(2, 100, 16), column_major_d(2, 37, 16), column_major_d(2, 37, 16)
    with pytest.raises(ValueError, match="loader: 'tma' needs unit stride"):
        flash_forward(q, k, v, True, loader="tma")
    check_function(FlashAttentionTriton, q, k, v, torch.randn(2, 100, 16), True, TOL[torch.float32])


def test_non_causal_d128_backward_has_its_own_dkdv_tile():
    bf16 = torch.bfloat16
    assert _table_config("dkdv", bf16, 128, causal=False) == TileConfig(32, 64, 4, 3)
    assert _table_config("dkdv", bf16, 128, causal=True) == _GPU_CONFIGS[("dkdv", True, False)]
    for kernel, head_dim, dtype in [("dq", 128, bf16), ("dkdv", 64, bf16), ("dkdv", 128, torch.float32)]:
        assert _table_config(kernel, dtype, head_dim, causal=False) == _table_config(
            kernel, dtype, head_dim, causal=True
        )


def test_flash_forward_rejects_unknown_loader():
    q, k, v, _ = make_inputs(1, 9, 9, 16, torch.float32)
    with pytest.raises(ValueError, match="loader: unknown"):
        flash_forward(q, k, v, True, loader="cp.async")


def test_impl_is_checked_and_gluon_is_refused_where_it_cannot_run():
    q, k, v, _ = make_inputs(1, 9, 9, 16, torch.float32)
    with pytest.raises(ValueError, match="impl: unknown 'cuda'"):
        flash_forward(q, k, v, True, impl="cuda")
    # float32 (and, without a GPU, the interpreter) has no Gluon kernel: asking for it is an error.
    with pytest.raises(ValueError, match="impl: 'gluon' needs "):
        FlashAttentionTriton.apply(q, k, v, True, "gluon")
    q, k, v, grad_out = make_inputs(1, 20, 19, 16, torch.float32)
    check_function(FlashAttentionTriton, q, k, v, grad_out, True, TOL[torch.float32], "triton")


BAD_INPUTS = [
    ("4-D q", lambda q, k, v: (q[:, None], k, v), "q: expected 3 dimensions"),
    ("batch", lambda q, k, v: (q, k[:1], v[:1]), "k: batch size"),
    ("head dim", lambda q, k, v: (q, k[..., :8], v[..., :8]), "head dim"),
    ("k vs v length", lambda q, k, v: (q, k, v[:, :5]), "v: 5 keys"),
    ("dtype", lambda q, k, v: (q, k.double(), v), "k: "),
    ("empty", lambda q, k, v: (q[:, :0], k, v), ">= 1"),
]


@pytest.mark.parametrize("fn", [FlashAttentionPyTorch, FlashAttentionTriton], ids=["pytorch", "triton"])
@pytest.mark.parametrize("what,mutate,message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_raises(fn, what, mutate, message):
    q, k, v, _ = make_inputs(2, 9, 9, 16, torch.float32)
    with pytest.raises(ValueError, match=message):
        fn.apply(*mutate(q, k, v), False)


def test_triton_rejects_unsupported_head_dim_and_dtype():
    q, k, v, _ = make_inputs(1, 9, 9, 24, torch.float32)
    with pytest.raises(ValueError, match="q: unsupported head dim D=24"):
        FlashAttentionTriton.apply(q, k, v)
    q, k, v, _ = make_inputs(1, 9, 9, 16, torch.float64)
    with pytest.raises(ValueError, match="q: unsupported dtype torch.float64"):
        FlashAttentionTriton.apply(q, k, v)


def test_flops_count_attended_pairs():
    assert attention_flops(1, 4, 4, 8, False, "fwd") == 4 * 16 * 8
    assert attention_flops(1, 4, 4, 8, True, "fwd") == 4 * 10 * 8  # 1 + 2 + 3 + 4 pairs
    assert attention_flops(1, 6, 4, 8, True, "fwd") == 4 * (10 + 2 * 4) * 8
    assert attention_flops(2, 4, 4, 8, True, "fwd+bwd") == 3.5 * 2 * 4 * 10 * 8


# --- GPU ---------------------------------------------------------------------------------------

GPU_CASES = [(1, 1, True), (17, 17, True), (257, 257, False), (257, 257, True), (100, 1000, True),
             (1000, 100, True), (1000, 100, False), (4096, 4096, True), (4096, 4096, False)]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize(
    "impl", ["triton", pytest.param("gluon", marks=pytest.mark.skipif(not HOPPER, reason="Hopper"))]
)
@pytest.mark.parametrize("n_q,n_k,causal", GPU_CASES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_triton_gpu_bf16(n_q, n_k, causal, head_dim, impl):
    q, k, v, grad_out = make_inputs(2, n_q, n_k, head_dim, torch.bfloat16, seed=n_q + n_k)
    check_function(FlashAttentionTriton, q, k, v, grad_out, causal, TOL[torch.bfloat16], impl)


# The Gluon kernels' causal bookkeeping: a 192-row query block of three 64-row warpgroups against
# 128-key tiles (the forward), 128-key blocks of two 64-key warpgroups against 64-row query tiles
# (dK/dV) -- lengths on and off those boundaries, Nq != Nk both ways, batch 3.
GLUON_CAUSAL_LENGTHS = [(63, 63), (64, 64), (127, 129), (191, 191), (192, 192), (193, 193), (385, 385),
                        (1000, 1000), (1025, 1025), (200, 1000), (1000, 200), (1, 300), (300, 1)]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU (the Gluon kernels)")
@pytest.mark.parametrize("n_q,n_k", GLUON_CAUSAL_LENGTHS)
@pytest.mark.parametrize("head_dim,dtype", [(64, torch.bfloat16), (64, torch.float16), (128, torch.bfloat16)])
def test_gluon_causal_matches_float64(n_q, n_k, head_dim, dtype):
    q, k, v, grad_out = make_inputs(3, n_q, n_k, head_dim, dtype, seed=n_q * 7 + n_k)
    check_function(FlashAttentionTriton, q, k, v, grad_out, True, TOL[dtype], "gluon")


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU (the Gluon kernels)")
@pytest.mark.parametrize("n_q,n_k,causal", [(193, 193, True), (1000, 200, True), (1025, 1025, False)])
def test_gluon_deterministic_backward_matches_float64_and_repeats(n_q, n_k, causal):
    """``deterministic=True``: the separate Triton dQ pass instead of the fused kernel's reductions,
    right and the same bits on every call."""
    q, k, v, grad_out = make_inputs(2, n_q, n_k, 64, torch.bfloat16, seed=n_q + 3 * n_k)
    check_function(FlashAttentionTriton, q, k, v, grad_out, causal, TOL[torch.bfloat16], "gluon", True)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    runs = [
        torch.autograd.grad(FlashAttentionTriton.apply(q, k, v, causal, "gluon", True), (q, k, v), grad_out)
        for _ in range(3)
    ]
    for got in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(got, runs[0], strict=True))


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU (the Gluon kernels)")
def test_gluon_causal_strided_inputs():
    """q, k, v as views of one fused QKV buffer (row stride 3 D): TMA reads them in place."""
    q, k, v = torch.randn(2, 1000, 3, 64, dtype=torch.bfloat16, device=DEVICE).unbind(2)
    grad_out = torch.randn(2, 1000, 64, dtype=torch.bfloat16, device=DEVICE)
    check_function(FlashAttentionTriton, q, k, v, grad_out, True, TOL[torch.bfloat16], "gluon")


@pytest.mark.gpu
@pytest.mark.parametrize("n_q,n_k", [(4096, 4096), (4097, 4096), (257, 1000), (1000, 257)])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("loader", ["tma", "blockptr"])
def test_triton_gpu_forward_loaders(loader, head_dim, n_q, n_k):
    q, k, v, _ = make_inputs(3, n_q, n_k, head_dim, torch.bfloat16, seed=n_q)
    with poisoned_empty():
        o, lse = flash_forward(q, k, v, True, loader=loader)
    o_ref, lse_ref = reference_attention(q, k, v, is_causal=True)
    assert_close("O", o, o_ref, TOL[torch.bfloat16])
    assert_close("L", lse, lse_ref, TOL[torch.bfloat16])


@pytest.mark.gpu
def test_triton_gpu_block_pointer_fallback():
    q, k, v = (column_major_d(2, 1000, 64, torch.bfloat16) for _ in range(3))
    grad_out = torch.randn(2, 1000, 64, dtype=torch.bfloat16, device=DEVICE)
    check_function(FlashAttentionTriton, q, k, v, grad_out, True, TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("head_dim", [16, 32, 64, 128])
@pytest.mark.parametrize("n_q,n_k", [(300, 211), (2048, 2048)])
def test_triton_gpu_float32_against_float64(n_q, n_k, head_dim, causal):
    # IEEE float32 dots under torch's default "highest": float32 rounding only.
    assert torch.get_float32_matmul_precision() == "highest"
    q, k, v, grad_out = make_inputs(3, n_q, n_k, head_dim, torch.float32)
    check_function(FlashAttentionTriton, q, k, v, grad_out, causal, 1e-4)


@pytest.mark.gpu
def test_triton_gpu_float32_honours_high_precision():
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:  # TF32 allowed: errors of TF32's size, the call runs
        q, k, v, grad_out = make_inputs(3, 300, 211, 64, torch.float32)
        check_function(FlashAttentionTriton, q, k, v, grad_out, True, 2e-2)
    finally:
        torch.set_float32_matmul_precision(previous)


@pytest.mark.gpu
def test_triton_gpu_fp16():
    q, k, v, grad_out = make_inputs(3, 300, 211, 16, torch.float16)
    check_function(FlashAttentionTriton, q, k, v, grad_out, True, 1e-2)


def test_auto_takes_gluon_from_the_threshold(monkeypatch):
    """The dispatch rule alone (the kernels need a Hopper GPU): where the Gluon forward could run,
    "auto" takes it from GLUON_FROM_N keys on, "gluon" at any length, "triton" never."""
    monkeypatch.setattr(flash2.forward_hopper, "unsupported_reason", lambda q, k, v: None)
    q = torch.empty(1, 5, 64)
    for n_k, auto in [(flash2.GLUON_FROM_N - 1, False), (flash2.GLUON_FROM_N, True)]:
        k = torch.empty(1, n_k, 64)
        assert flash2._uses_gluon(q, k, k, "auto") is auto, n_k
        assert flash2._uses_gluon(q, k, k, "gluon") is True
        assert flash2._uses_gluon(q, k, k, "triton") is False
    monkeypatch.setattr(flash2.forward_hopper, "unsupported_reason", lambda q, k, v: "a Hopper GPU")
    k = torch.empty(1, flash2.GLUON_FROM_N, 64)
    assert flash2._uses_gluon(q, k, k, "auto") is False
    with pytest.raises(ValueError, match="impl: 'gluon' needs a Hopper GPU"):
        flash2._uses_gluon(q, k, k, "gluon")
