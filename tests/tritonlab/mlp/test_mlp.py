"""tritonlab.mlp against a float64 reference: values, gradients, views, autocast, the model, bad input,
torch.compile through the custom ops, the config spaces' pruning by shared memory, and float32 and
Inductor in bf16 on the GPU."""

import pytest
import torch

from tritonlab import _gemm, mlp, tuning
from tritonlab.mlp import (
    FusedMLP,
    fused_mlp,
    fused_mlp_in_registers,
    gemm_silu_mlp,
    pad_hidden,
    padded_cublas_mlp,
)
from tritonlab.models import mlp_eager
from tritonlab.testing import check_against_float64, rel_err
from tritonlab.tuning import HOPPER_SHARED_MEMORY, ConfigRecord

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
VARIANTS = {
    "fused": lambda x, w1, w2: fused_mlp(x, w1, w2, save_preactivation=True),
    "fused-recompute": fused_mlp,
    "fused-registers": fused_mlp_in_registers,
    "gemm-silu": gemm_silu_mlp,
    "padded-cublas": padded_cublas_mlp,
}


def _t(*shape, dtype=torch.float32, device=None):
    return torch.randn(*shape, device=device or DEVICE).to(dtype)


def random_mlp(T, d_model, d_ff, n_out, dtype):
    x = torch.randn(T, d_model, device=DEVICE)
    w1 = torch.randn(d_ff, d_model, device=DEVICE) / d_model**0.5
    w2 = torch.randn(n_out, d_ff, device=DEVICE) / d_ff**0.5
    return [t.to(dtype) for t in (x, w1, w2)], torch.randn(T, n_out, device=DEVICE).to(dtype)


def check(fn, inputs, grad_out, tol):
    return check_against_float64(fn, mlp_eager, inputs, grad_out, tol, ["y", "dx", "dw1", "dw2"])


# d_ff = 300 is not a multiple of 16 (like 1365) and spans several hidden chunks, 160 outputs several
# output blocks (in the interpreter's config); T crosses row blocks at 1001.
# fp32 at every T; fp16 (slow in the interpreter, same code path) at the two small ones.
@pytest.mark.parametrize(
    ("dtype", "T"),
    [(torch.float32, 1), (torch.float32, 37), (torch.float32, 1001), (torch.float16, 1), (torch.float16, 37)],
)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_small_dims_match_float64(variant, dtype, T):
    inputs, grad_out = random_mlp(T, 32, 300, 160, dtype)
    check(VARIANTS[variant], inputs, grad_out, 1e-5 if dtype == torch.float32 else 5e-3)


def test_pad_hidden_adds_zeros_to_a_multiple_of_16():
    w1, w2 = torch.randn(300, 32), torch.randn(160, 300)
    w1p, w2p = pad_hidden(w1, w2)
    assert w1p.shape == (304, 32) and w2p.shape == (160, 304)
    assert torch.equal(w1p[:300], w1) and torch.equal(w2p[:, :300], w2)
    assert not w1p[300:].any() and not w2p[:, 300:].any()
    aligned = torch.randn(320, 32), torch.randn(160, 320)
    assert all(a is b for a, b in zip(pad_hidden(*aligned), aligned, strict=True))  # no copy


def test_real_weight_shapes():
    inputs, grad_out = random_mlp(3, 512, 1365, 512, torch.float32)
    check(fused_mlp, inputs, grad_out, 1e-5)


def check_on_views(x, w1, w2, grad_out, tol):
    """fused_mlp on these very tensors, against float64 eager on dense copies."""
    y = fused_mlp(x, w1, w2)
    grads = torch.autograd.grad(y, [x, w1, w2], grad_out)
    dense = [t.detach().double().requires_grad_() for t in (x, w1, w2)]
    ref = mlp_eager(*dense)
    ref_grads = torch.autograd.grad(ref, dense, grad_out.double())
    for name, got, want in zip(["y", "dx", "dw1", "dw2"], [y, *grads], [ref, *ref_grads], strict=True):
        assert got.shape == want.shape and rel_err(got, want) < tol, name


def test_strided_views_are_read_right():
    # Every second column of x and a transposed W2: the staged forward's TMA descriptors need unit
    # last strides, so such views are copied first; the values must not change.
    (x, w1, w2), grad_out = random_mlp(37, 64, 300, 160, torch.float32)
    x_view = x.requires_grad_()[:, ::2]
    w2_view = w2.t().contiguous().requires_grad_().t()
    assert x_view.stride(1) == 2 and w2_view.stride(1) != 1
    check_on_views(x_view, w1[:, :32].contiguous().requires_grad_(), w2_view, grad_out, 1e-5)


def test_misaligned_start_is_read_right():
    # A view one element into its storage starts 4 bytes past a 16-byte boundary: no TMA
    # descriptor can address it, so the forward copies it first.
    (x, w1, w2), grad_out = random_mlp(37, 32, 300, 160, torch.float32)
    storage = torch.cat([torch.zeros(1, device=DEVICE), x.flatten()]).requires_grad_()
    x_shifted = storage[1:].view(37, 32)
    assert x_shifted.data_ptr() % 16 != 0
    check_on_views(x_shifted, w1.requires_grad_(), w2.requires_grad_(), grad_out, 1e-5)


def test_batched_input_and_autocast_casts_weights(autocast_casts_weights):
    # The model passes (B, L, d) activations; under autocast, fp32 weights are cast as F.linear casts them.
    x = torch.randn(2, 9, 32, device=DEVICE)
    w1 = torch.randn(40, 32, device=DEVICE, requires_grad=True)
    w2 = torch.randn(32, 40, device=DEVICE, requires_grad=True)
    assert autocast_casts_weights(mlp_eager, fused_mlp, x, w1, w2).shape == (2, 9, 32)


def test_plugs_into_the_model(plugs_into_the_model):
    plugs_into_the_model("mlp", fused_mlp, n_layers=2)


def test_module_is_fused_mlp_on_its_weights():
    module = FusedMLP(32, 40, device=DEVICE)
    x = torch.randn(5, 32, device=DEVICE)
    assert rel_err(module(x), mlp_eager(x, module.fc1.weight, module.fc2.weight)) < 1e-5


@pytest.mark.parametrize(
    ("name", "fn", "kernels"),
    [
        ("fused_mlp", fused_mlp, {"staged"}),
        ("in registers", fused_mlp_in_registers, {"registers"}),
        ("gemm-silu", gemm_silu_mlp, {"hidden"}),
    ],
)
def test_record_names_the_tiles_each_forward_ran(name, fn, kernels):
    (x, w1, w2), _ = random_mlp(5, 32, 40, 32, torch.float32)
    record = ConfigRecord()
    fn(x, w1, w2, record=record)
    assert set(record.picked) == kernels, name
    assert all("warps=" in tiles for tiles in record.picked.values())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((_t(5, 32), _t(40, 16), _t(32, 40)), "w1: expected \\(D_FF, 32\\)"),
        ((_t(5, 32), _t(40, 32), _t(32, 41)), "w2: expected \\(N_OUT, 40\\)"),
        ((_t(5, 32), _t(40, 32), _t(32, 40, 1)), "shapes"),
        ((_t(5, 32), _t(40, 32, dtype=torch.float16), _t(32, 40)), "dtypes"),
        ((_t(5, 32, dtype=torch.int32), _t(40, 32), _t(32, 40)), "x: unsupported dtype"),
        ((_t(5, 24), _t(40, 24), _t(24, 40)), "multiple of 16"),
        ((_t(0, 32), _t(40, 32), _t(32, 40)), "x: expected at least one row"),
        ((_t(5, 32, device="meta"), _t(40, 32), _t(32, 40)), "x: expected a tensor on"),
        (("x", _t(40, 32), _t(32, 40)), "x: expected a torch.Tensor"),
    ],
)
def test_bad_input_raises(args, message):
    with pytest.raises(ValueError, match=message):
        fused_mlp(*args)


# -- torch.compile: the custom ops -----------------------------------------------------------------

COMPILED = ["fused", "fused-recompute", "fused-registers"]  # the variants with a custom op


@pytest.mark.parametrize("variant", COMPILED)
def test_compiled_matches_eager_and_float64(variant, compiled_matches_eager):
    # (B, L, d) activations and d_ff = 40, padded to 48: the reshapes, the padding and its gradient's
    # slicing are traced around the op.
    x = torch.randn(2, 9, 32, device=DEVICE)
    w1 = torch.randn(40, 32, device=DEVICE) / 32**0.5
    w2 = torch.randn(24, 40, device=DEVICE) / 40**0.5
    grad_out = torch.randn(2, 9, 24, device=DEVICE)
    compiled = compiled_matches_eager(VARIANTS[variant], (x, w1, w2), grad_out, 1e-6)
    check(compiled, (x, w1, w2), grad_out, 1e-5)


@pytest.mark.parametrize(("save", "in_registers"), [(False, False), (True, False), (False, True)])
def test_custom_ops_fake_matches_real(save, in_registers, custom_op_checks):
    # The ops take padded weights (D_FF a multiple of 16); W2 transposed, dy strided.
    (x, w1, w2), dy = random_mlp(13, 32, 48, 24, torch.float32)
    w2 = w2.t().contiguous().t()
    dy = torch.randn(24, 13, device=DEVICE).t()
    leaves = [t.clone().requires_grad_() for t in (x, w1)] + [w2.detach().requires_grad_()]
    custom_op_checks(torch.ops.tritonlab.fused_mlp_forward, *leaves, save, in_registers)
    _, a = torch.ops.tritonlab.fused_mlp_forward(x, w1, w2, save, in_registers)
    custom_op_checks(torch.ops.tritonlab.fused_mlp_backward, x, w1, w2, a if save else None, dy)


def test_a_record_is_refused_under_compile():
    (x, w1, w2), _ = random_mlp(5, 32, 40, 32, torch.float32)
    record = ConfigRecord()
    compiled = torch.compile(lambda *xw: fused_mlp(*xw, record=record), fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="record: fused_mlp cannot fill a ConfigRecord under torch.compile"):
        compiled(x, w1, w2)


# -- the config spaces fit the GPU's shared memory -----------------------------------------------------


@pytest.fixture
def h100_budget(monkeypatch):
    """The H100's opt-in shared memory per block, and the GPU's 128-row staged tile."""
    monkeypatch.setattr(tuning, "shared_memory_bytes", lambda device_index=None: HOPPER_SHARED_MEMORY)
    monkeypatch.setattr(mlp, "_STAGED_BLOCK_M", 128)


def test_float32_staged_configs_are_the_fallbacks_that_fit(h100_budget):
    primary = mlp._staged_configs(mlp._STAGED_TILES)
    fallback = mlp._staged_configs(mlp._STAGED_FALLBACK_TILES)
    # The crash this pruning prevents: 294 912 B of pipelined tiles (+ barriers) for the first config.
    assert mlp._staged_smem(primary[0], 4) > HOPPER_SHARED_MEMORY
    kept = _gemm.fitting_configs(primary + fallback, 4, mlp._staged_smem, fallback)
    assert kept == fallback
    assert all(mlp._staged_smem(c, 4) <= HOPPER_SHARED_MEMORY for c in kept)
    # 16-bit inputs keep the measured space, fallbacks left out.
    assert _gemm.fitting_configs(primary + fallback, 2, mlp._staged_smem, fallback) == primary


def test_register_and_hidden_spaces_drop_what_does_not_fit(h100_budget):
    for tiles, estimate in (
        (mlp._REGISTER_TILES, _gemm.register_forward_smem),
        (mlp._HIDDEN_TILES, _gemm.hidden_kernel_smem),
    ):
        configs = _gemm.tile_configs(tiles)
        kept = _gemm.fitting_configs(configs, 4, estimate)
        assert 0 < len(kept) < len(configs)
        assert all(estimate(c, 4) <= HOPPER_SHARED_MEMORY for c in kept)
        assert _gemm.fitting_configs(configs, 2, estimate) == configs


def test_pruner_reads_the_element_size_of_the_kernels_tensor(h100_budget, monkeypatch):
    configs = _gemm.tile_configs(mlp._REGISTER_TILES)
    prune = _gemm.shared_memory_pruner(_gemm.register_forward_smem, "x_ptr")
    assert prune(configs, {"x_ptr": torch.empty(1, dtype=torch.bfloat16)}) == configs
    assert len(prune(configs, {"x_ptr": torch.empty(1, dtype=torch.float32)})) < len(configs)
    monkeypatch.setattr(tuning, "shared_memory_bytes", lambda device_index=None: 1024)
    smallest = min(configs, key=lambda c: _gemm.register_forward_smem(c, 4))
    assert prune(configs, {"x_ptr": torch.empty(1)}) == [smallest]  # nothing fits: the compiler says why


# -- on the GPU ----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 37, 1001])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gpu_bf16_real_shapes_match_float64(variant, T):
    inputs, grad_out = random_mlp(T, 512, 1365, 512, torch.bfloat16)
    check(VARIANTS[variant], inputs, grad_out, 1.5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("save", [False, True])
def test_gpu_staged_forward_reuses_each_programs_scratch(save):
    # 20 011 rows are 157 row blocks of 128: more than one per program on a GPU of up to 156 SMs,
    # so programs overwrite their scratch, and the last block is partial.
    inputs, grad_out = random_mlp(20_011, 512, 1365, 512, torch.bfloat16)
    check(lambda x, w1, w2: fused_mlp(x, w1, w2, save_preactivation=save), inputs, grad_out, 1.5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [37, 1001])
def test_gpu_fp16_staged_forward_matches_float64(T):
    # fp16 keeps 3 more mantissa bits than bf16: the staged forward's tanh.approx SiLU must stay
    # within fp16's tolerance too.
    inputs, grad_out = random_mlp(T, 512, 1365, 512, torch.float16)
    check(fused_mlp, inputs, grad_out, 5e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", COMPILED)
def test_gpu_inductor_bf16_matches_eager_and_float64(variant, compiled_matches_eager):
    inputs, grad_out = random_mlp(1001, 512, 1365, 512, torch.bfloat16)
    compiled = compiled_matches_eager(VARIANTS[variant], inputs, grad_out, 1e-3, "inductor")
    check(compiled, inputs, grad_out, 1.5e-2)


MID_TOKENS = 4 * (10_000 + 1_000)  # the MLP's tokens at the TransformerNP's mid shape


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["fused", "fused-recompute", "fused-registers", "gemm-silu"])
def test_gpu_float32_at_the_models_mid_shape_matches_float64(variant, float32_matmul_precision):
    # Under the default "highest" precision every dot is IEEE float32: errors of float32 rounding
    # (~1e-6), where TF32 products read ~1e-3. The staged forward's 2-byte tiles do not fit the
    # shared memory with 4-byte elements; the pruned space must.
    float32_matmul_precision("highest")
    inputs, grad_out = random_mlp(MID_TOKENS, 512, 1365, 512, torch.float32)
    check(VARIANTS[variant], inputs, grad_out, 5e-5)


@pytest.mark.gpu
def test_gpu_float32_under_high_precision_runs_tf32(float32_matmul_precision):
    # "high" allows TF32, as for torch.matmul: the error may grow to TF32's, and nothing may crash.
    float32_matmul_precision("high")
    inputs, grad_out = random_mlp(MID_TOKENS, 512, 1365, 512, torch.float32)
    check(fused_mlp, inputs, grad_out, 2e-2)
