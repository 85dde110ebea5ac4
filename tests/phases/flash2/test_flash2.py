"""FlashAttention-2, PyTorch and Triton: O, L and dQ/dK/dV against a float64 reference.

CPU: the PyTorch version directly, the Triton kernels in the interpreter in fp32/fp16 (its tl.dot
on bf16 is not trustworthy). GPU (`just test-gpu`): the compiled kernels in bf16 on block-crossing
shapes. Outputs are poisoned with NaN before each run, so a tile the kernel never writes shows up.
"""

import importlib

import pytest
import torch

import common

flash2 = importlib.import_module("phases.flash2")
flash_triton = importlib.import_module("phases.flash2.flash_triton")
checks = importlib.import_module("tests.phases.06_fused_mlp.float64_checks")

TOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}

# (Nq, Nk): odd lengths, 1, and Nq != Nk both ways.
LENGTHS = [(1, 1), (17, 17), (100, 100), (257, 257), (17, 100), (100, 17), (1, 33)]
CPU_CASES = [(nq, nk, causal) for nq, nk in LENGTHS for causal in (False, True)]


def make_inputs(batch, n_q, n_k, head_dim, dtype, device="cpu", seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    make = lambda n: torch.randn(batch, n, head_dim, generator=gen, device=device, dtype=dtype)
    q, k, v = make(n_q), make(n_k), make(n_k)
    grad_out = make(n_q)
    return q, k, v, grad_out


def reference_grads(q, k, v, grad_out, is_causal):
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o, lse = flash2.reference_attention(q64, k64, v64, is_causal)
    return o.detach(), lse, torch.autograd.grad(o, (q64, k64, v64), grad_out.double())


def assert_close(name, got, want, tol):
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol, msg=lambda m: f"{name}: {m}")


def check_function(fn, q, k, v, grad_out, is_causal, tol, saved_lse):
    o_ref, lse_ref, grads_ref = reference_grads(q, k, v, grad_out, is_causal)
    q, k, v = (checks.same_layout_leaf(t) for t in (q, k, v))
    o = fn.apply(q, k, v, is_causal)
    assert o.shape == q.shape and o.dtype == q.dtype
    assert_close("O", o, o_ref, tol)
    assert_close("L", saved_lse(o), lse_ref, tol)
    grads = torch.autograd.grad(o, (q, k, v), grad_out)
    for name, got, want, inp in zip(("dQ", "dK", "dV"), grads, grads_ref, (q, k, v), strict=True):
        assert got.shape == inp.shape and got.dtype == inp.dtype
        assert_close(name, got, want, tol)


def lse_of(output):
    """L as the forward saved it: the only saved tensor of shape (B, Nq)."""
    saved = [t for t in output.grad_fn.saved_tensors if t.shape == output.shape[:2]]
    assert len(saved) == 1, [tuple(t.shape) for t in output.grad_fn.saved_tensors]
    return saved[0]


# ----------------------------------------------------------------------------------------------
# PyTorch version (CPU)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_q,n_k,causal", CPU_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pytorch_matches_reference(n_q, n_k, causal, dtype):
    q, k, v, grad_out = make_inputs(2, n_q, n_k, 24, dtype, seed=n_q * 1000 + n_k)
    check_function(flash2.FlashAttentionPyTorch, q, k, v, grad_out, causal, TOL[dtype], lse_of)


def test_pytorch_gradcheck_float64():
    q, k, v, _ = make_inputs(1, 6, 9, 4, torch.float64)
    for causal in (False, True):
        inputs = tuple(t.clone().requires_grad_() for t in (q, k, v))
        assert torch.autograd.gradcheck(
            lambda a, b, c, causal=causal: flash2.FlashAttentionPyTorch.apply(a, b, c, causal), inputs
        )


def test_pytorch_uses_tiles():
    """The forward really is tiled: lengths below one tile and above several give the same answer."""
    assert flash2.FlashAttentionPyTorch.Q_TILE >= 16 and flash2.FlashAttentionPyTorch.K_TILE >= 16
    q, k, v, _ = make_inputs(1, 3 * flash2.FlashAttentionPyTorch.Q_TILE + 5, 70, 16, torch.float32)
    o = flash2.FlashAttentionPyTorch.apply(q, k, v, True)
    assert_close("O", o, flash2.reference_attention(q, k, v, True)[0], 1e-5)


def test_naive_attention_matches_reference():
    q, k, v, _ = make_inputs(2, 33, 47, 16, torch.float64)
    mask = flash2.causal_mask(33, 47)
    assert_close("naive", flash2.naive_attention(q, k, v), flash2.reference_attention(q, k, v)[0], 1e-9)
    assert_close(
        "naive causal",
        flash2.naive_attention(q, k, v, mask),
        flash2.reference_attention(q, k, v, True)[0],
        1e-9,
    )


# ----------------------------------------------------------------------------------------------
# Triton version: interpreter on the CPU (fp32, fp16), compiled on the GPU (bf16)
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def poisoned(monkeypatch):
    """Every tensor the Triton wrappers allocate starts as NaN, so an unwritten tile fails the test."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def nan_filled(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(flash_triton.torch, "empty", lambda *a, **kw: nan_filled(real_empty(*a, **kw)))
    monkeypatch.setattr(
        flash_triton.torch, "empty_like", lambda *a, **kw: nan_filled(real_empty_like(*a, **kw))
    )


INTERPRETER_CASES = [
    (1, 1, True),
    (17, 17, False),
    (17, 17, True),
    (100, 37, True),
    (37, 100, False),
    (37, 100, True),
    (100, 100, True),
]


@pytest.mark.skipif(common.ON_GPU, reason="interpreter test (the GPU runs the bf16 ones)")
@pytest.mark.parametrize("n_q,n_k,causal", INTERPRETER_CASES)
@pytest.mark.parametrize("dtype,head_dim", [(torch.float32, 16), (torch.float16, 32)])
def test_triton_interpreter_matches_reference(n_q, n_k, causal, dtype, head_dim, poisoned):
    q, k, v, grad_out = make_inputs(2, n_q, n_k, head_dim, dtype, seed=n_q + 7 * n_k)
    check_function(flash2.FlashAttentionTriton, q, k, v, grad_out, causal, TOL[dtype], lse_of)


@pytest.mark.skipif(common.ON_GPU, reason="interpreter test")
def test_triton_interpreter_257_and_strided(poisoned):
    """The longest odd length, with q, k, v non-contiguous views (as a fused QKV projection gives)."""
    qkv = torch.randn(1, 257, 3, 16)
    q, k, v = qkv.unbind(2)
    assert not checks.same_layout_leaf(q).is_contiguous()  # what check_function passes on
    grad_out = torch.randn(1, 257, 16)
    check_function(flash2.FlashAttentionTriton, q, k, v, grad_out, True, TOL[torch.float32], lse_of)


@pytest.mark.skipif(common.ON_GPU, reason="interpreter test")
@pytest.mark.parametrize("block_m,block_n", [(16, 32), (32, 16)])
def test_triton_interpreter_unequal_tiles(block_m, block_n, poisoned, monkeypatch):
    """The GPU tiles differ per kernel (e.g. dK/dV with 32 queries x 64 keys): the diagonal and ragged
    tile bookkeeping must hold when BLOCK_M != BLOCK_N too."""
    for kernel in ("fwd", "dq", "dkdv"):
        monkeypatch.setitem(
            flash_triton.INTERPRETER_CONFIGS, kernel, flash2.TileConfig(block_m, block_n, 4, 1)
        )
    for n_q, n_k in [(50, 50), (33, 70), (70, 33)]:
        q, k, v, grad_out = make_inputs(1, n_q, n_k, 16, torch.float32, seed=n_q)
        check_function(flash2.FlashAttentionTriton, q, k, v, grad_out, True, TOL[torch.float32], lse_of)
    q, k, v, grad_out = make_inputs(1, 45, 45, 16, torch.float32)
    check_function(flash2.FlashAttentionTriton, q, k, v, grad_out, False, TOL[torch.float32], lse_of)


# Forward only, both loaders: causal and not, odd lengths, Nq != Nk both ways, unequal tiles. Batch 3:
# the causal grid runs batch-fastest, so a batch that does not divide the tile count is the test.
FORWARD_LENGTHS = [(1, 1), (17, 17), (100, 100), (257, 257), (17, 100), (100, 17), (1, 257), (257, 1)]


@pytest.mark.skipif(common.ON_GPU, reason="interpreter test")
@pytest.mark.parametrize("block_m,block_n", [(16, 16), (16, 32), (32, 16)])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("loader", ["tma", "blockptr"])
def test_triton_interpreter_forward_loaders(loader, causal, block_m, block_n, poisoned, monkeypatch):
    monkeypatch.setitem(flash_triton.INTERPRETER_CONFIGS, "fwd", flash2.TileConfig(block_m, block_n, 4, 1))
    for n_q, n_k in FORWARD_LENGTHS:
        q, k, v, _ = make_inputs(3, n_q, n_k, 16, torch.float32, seed=n_q + 3 * n_k)
        o, lse = flash2.flash_forward(q, k, v, causal, loader=loader)
        o_ref, lse_ref = flash2.reference_attention(q.double(), k.double(), v.double(), causal)
        assert_close(f"O {n_q}x{n_k}", o, o_ref, TOL[torch.float32])
        assert_close(f"L {n_q}x{n_k}", lse, lse_ref, TOL[torch.float32])


@pytest.mark.skipif(common.ON_GPU, reason="interpreter test")
def test_triton_interpreter_backward_saturated_scores(poisoned):
    """Every score near -150 (after scaling), so L is too: the zero rows padding a ragged key tile
    would give P = exp(0 - L) = inf there, and inf x 0 = NaN in dQ, unless that tile is masked."""
    gen = torch.Generator().manual_seed(3)
    q = -6.0 + 0.3 * torch.randn(2, 40, 16, generator=gen)
    k = 6.0 + 0.3 * torch.randn(2, 23, 16, generator=gen)
    v, grad_out = torch.randn(2, 23, 16, generator=gen), torch.randn(2, 40, 16, generator=gen)
    for causal in (False, True):
        check_function(flash2.FlashAttentionTriton, q, k, v, grad_out, causal, 1e-3, lse_of)


def column_major_d(batch, n, head_dim, dtype=torch.float32):
    """(B, N, D) with stride N along D (the transpose of a (B, D, N) buffer): no TMA possible."""
    return torch.randn(batch, head_dim, n, dtype=dtype, device=common.DEVICE.type).transpose(1, 2)


@pytest.mark.skipif(common.ON_GPU, reason="interpreter test")
def test_triton_interpreter_falls_back_to_block_pointers(poisoned):
    """D not contiguous: "auto" takes block pointers (forward and backward correct), "tma" refuses."""
    q, k, v = column_major_d(2, 100, 16), column_major_d(2, 37, 16), column_major_d(2, 37, 16)
    with pytest.raises(ValueError, match="loader: 'tma' needs unit stride"):
        flash2.flash_forward(q, k, v, True, loader="tma")
    grad_out = torch.randn(2, 100, 16)
    check_function(flash2.FlashAttentionTriton, q, k, v, grad_out, True, TOL[torch.float32], lse_of)


def test_non_causal_d128_backward_has_its_own_dkdv_tile(monkeypatch):
    monkeypatch.setattr(flash_triton, "ON_GPU", True)  # the GPU table, read without a GPU
    bf16 = torch.bfloat16
    assert flash_triton.tile_config("dkdv", bf16, 128, causal=False) == flash_triton.TileConfig(32, 64, 4, 3)
    assert (
        flash_triton.tile_config("dkdv", bf16, 128, causal=True)
        == flash_triton.GPU_CONFIGS[("dkdv", True, False)]
    )
    for kernel, head_dim, dtype in [("dq", 128, bf16), ("dkdv", 64, bf16), ("dkdv", 128, torch.float32)]:
        assert flash_triton.tile_config(kernel, dtype, head_dim, causal=False) == flash_triton.tile_config(
            kernel, dtype, head_dim, causal=True
        )


def test_flash_forward_rejects_unknown_loader():
    q, k, v, _ = make_inputs(1, 9, 9, 16, torch.float32, device=common.DEVICE.type)
    with pytest.raises(ValueError, match="loader: unknown"):
        flash2.flash_forward(q, k, v, True, loader="cp.async")


GPU_CASES = [
    (1, 1, True),
    (17, 17, True),
    (257, 257, False),
    (257, 257, True),
    (100, 1000, True),
    (1000, 100, True),
    (1000, 100, False),
    (4096, 4096, True),
    (4096, 4096, False),  # at d = 128 the non-causal dK/dV tile of its own
]


@pytest.mark.gpu
@pytest.mark.parametrize("n_q,n_k,causal", GPU_CASES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_triton_gpu_bf16(n_q, n_k, causal, head_dim, poisoned):
    q, k, v, grad_out = make_inputs(2, n_q, n_k, head_dim, torch.bfloat16, device="cuda", seed=n_q + n_k)
    check_function(flash2.FlashAttentionTriton, q, k, v, grad_out, causal, TOL[torch.bfloat16], lse_of)


@pytest.mark.gpu
@pytest.mark.parametrize("n_q,n_k", [(4096, 4096), (4097, 4096), (257, 1000), (1000, 257)])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("loader", ["tma", "blockptr"])
def test_triton_gpu_forward_loaders(loader, head_dim, n_q, n_k, poisoned):
    """The causal bf16 forward through each loader, with the table's tiles (TMA is the default)."""
    q, k, v, _ = make_inputs(3, n_q, n_k, head_dim, torch.bfloat16, device="cuda", seed=n_q)
    o, lse = flash2.flash_forward(q, k, v, True, loader=loader)
    o_ref, lse_ref = flash2.reference_attention(q.double(), k.double(), v.double(), True)
    assert_close("O", o, o_ref, TOL[torch.bfloat16])
    assert_close("L", lse, lse_ref, TOL[torch.bfloat16])


@pytest.mark.gpu
def test_triton_gpu_block_pointer_fallback(poisoned):
    q, k, v = (column_major_d(2, 1000, 64, torch.bfloat16) for _ in range(3))
    grad_out = torch.randn(2, 1000, 64, dtype=torch.bfloat16, device="cuda")
    check_function(flash2.FlashAttentionTriton, q, k, v, grad_out, True, TOL[torch.bfloat16], lse_of)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,head_dim", [(torch.float16, 16), (torch.float32, 32), (torch.float32, 128)])
def test_triton_gpu_other_dtypes(dtype, head_dim, poisoned):
    q, k, v, grad_out = make_inputs(3, 300, 211, head_dim, dtype, device="cuda")
    check_function(flash2.FlashAttentionTriton, q, k, v, grad_out, True, 1e-2, lse_of)


# ----------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------

BAD_INPUTS = [
    ("4-D q", lambda q, k, v: (q[:, None], k, v), "q: expected a 3-D tensor"),
    ("batch", lambda q, k, v: (q, k[:1], v[:1]), "batch sizes"),
    ("head dim", lambda q, k, v: (q, k[..., :8], v[..., :8]), "head dims"),
    ("k vs v length", lambda q, k, v: (q, k, v[:, :5]), "v: sequence length"),
    ("dtype", lambda q, k, v: (q, k.double(), v), "k: dtype"),
    ("empty", lambda q, k, v: (q[:, :0], k, v), "q: sequence length"),
]


@pytest.mark.parametrize("fn", ["FlashAttentionPyTorch", "FlashAttentionTriton"])
@pytest.mark.parametrize("what,mutate,message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_raises(fn, what, mutate, message):
    q, k, v, _ = make_inputs(2, 9, 9, 16, torch.float32, device=common.DEVICE.type)
    with pytest.raises(ValueError, match=message):
        getattr(flash2, fn).apply(*mutate(q, k, v), False)


def test_triton_rejects_unsupported_head_dim_and_dtype():
    q, k, v, _ = make_inputs(1, 9, 9, 24, torch.float32, device=common.DEVICE.type)
    with pytest.raises(ValueError, match="q: head dim 24 is not supported"):
        flash2.FlashAttentionTriton.apply(q, k, v)
    q, k, v, _ = make_inputs(1, 9, 9, 16, torch.float64, device=common.DEVICE.type)
    with pytest.raises(ValueError, match="q: dtype torch.float64 is not supported"):
        flash2.FlashAttentionTriton.apply(q, k, v)


def test_flops_count_attended_pairs():
    assert flash2.attention_flops(1, 4, 4, 8, False, "fwd") == 4 * 16 * 8
    assert flash2.attention_flops(1, 4, 4, 8, True, "fwd") == 4 * 10 * 8  # 1 + 2 + 3 + 4 pairs
    assert flash2.attention_flops(1, 6, 4, 8, True, "fwd") == 4 * (10 + 2 * 4) * 8
    assert flash2.attention_flops(2, 4, 4, 8, True, "fwd+bwd") == 3.5 * 2 * 4 * 10 * 8


# ----------------------------------------------------------------------------------------------
# The scripts: arguments checked up front, and a tiny run of each part on the CPU
# ----------------------------------------------------------------------------------------------

flash2_main = importlib.import_module("phases.flash2.__main__")


@pytest.mark.parametrize(
    "argv",
    [
        ["flash-bench", "--d", "24"],
        ["attention-bench", "--seq", "0"],
        ["flash-bench", "--tune-shape", "1", "64", "48"],
    ],
)
def test_script_rejects_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit):
        flash2_main.parse_args(argv)
    assert "--" in capsys.readouterr().err


@pytest.mark.skipif(common.ON_GPU, reason="CPU smoke run")
def test_scripts_write_rows(tmp_path):
    import pandas as pd

    def rows_of(argv):
        flash2_main.main(argv)
        paths = list((tmp_path / "data" / "flash2").glob("*.csv"))
        rows = pd.concat(pd.read_csv(p) for p in paths)
        for p in paths:  # two runs in one second and process would share a file name
            p.unlink()
        assert (rows["status"] == "ok").all(), rows[["variant", "error"]]
        assert rows["ms"].gt(0).all()
        return rows

    naive = rows_of(["attention-bench", "--d", "16", "--seq", "16"])
    assert set(naive["bench"]) == {"attention"} and set(naive["pass"]) == {"fwd", "bwd"}
    flash = rows_of(["flash-bench", "--seq", "16", "--d", "16", "--dtype", "fp32"])
    assert set(flash["variant"]) == {"triton", "naive", "sdpa-math"}
    assert set(flash["pass"]) == {"fwd", "bwd", "fwd+bwd"}
    assert (tmp_path / "flash2.md").exists()
