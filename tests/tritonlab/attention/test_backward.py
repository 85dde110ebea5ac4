"""attention (two-pass backward) and fused_attention (fused backward; deterministic=True too):
outputs and gradients against autograd through float64 attention, determinism, the model with them
plugged in, torch.compile through their custom ops; on the GPU bf16 and float32 at the model's
shapes, and Inductor in bf16."""

import pytest
import torch
from triton.runtime.errors import OutOfResources

from tritonlab._runtime import kernel_device_type
from tritonlab.attention import attention, fused_attention, fused_attention_kv, reference_attention
from tritonlab.attention._common import backward_delta
from tritonlab.attention.backward import _INTERPRETER_CONFIG, _plan_query_chunks
from tritonlab.attention.fused import _drop_spilling
from tritonlab.testing import check_against_float64, model_qkv, poisoned_empty
from tritonlab.tuning import ConfigRecord

DEVICE = kernel_device_type()
GPU = DEVICE == "cuda"
TOLERANCE = {torch.float32: 5e-5, torch.float16: 1e-2, torch.bfloat16: 3e-2}
FUNCTIONS = {"two-pass": attention, "fused": fused_attention}


def gradient_errors(fn, B, H, Lq, Lk, D, dtype, scale_inputs=1.0, seed=0, scale=None) -> dict:
    """Errors max |ours − float64| / max(max |float64|, 1) of o, dq, dk, dv, on poisoned outputs.

    Relative to the largest reference value, floored at 1 so that a gradient that is exactly zero
    (one key: the softmax is constant) is not divided by nothing."""
    q, k, v = (t.detach().requires_grad_() for t in model_qkv(B, H, Lq, Lk, D, dtype, scale_inputs, seed))
    do = torch.randn(
        B, H, Lq, D, generator=torch.Generator(device=DEVICE).manual_seed(seed + 1), device=DEVICE
    ).to(dtype)
    with poisoned_empty():
        o = fn(q, k, v, scale)
        grads = torch.autograd.grad(o, (q, k, v), do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o64, _ = reference_attention(q64, k64, v64, scale)
    grads64 = torch.autograd.grad(o64, (q64, k64, v64), do.double())
    errors = {}
    for name, ours, theirs in zip(("o", "dq", "dk", "dv"), (o, *grads), (o64, *grads64), strict=True):
        assert ours.shape == theirs.shape and ours.dtype == dtype, name
        assert torch.isfinite(ours).all(), f"{name}: NaN or inf"
        errors[name] = (ours.double() - theirs).abs().max().item() / theirs.abs().max().clamp_min(1.0).item()
    return errors


@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize(
    ("B", "H", "Lq", "Lk", "D", "dtype"),
    [
        (1, 1, 1, 1, 16, torch.float32),
        (2, 3, 17, 100, 32, torch.float32),  # one query chunk: dK, dV written directly
        (1, 2, 257, 17, 64, torch.float16),  # several query chunks: partials and their reduction
        (2, 2, 70, 9, 32, torch.float16),  # one key block: the fused key programs write dQ as well
        (1, 1, 33, 20, 128, torch.float32),
    ],
)
def test_gradients_match_float64(name, B, H, Lq, Lk, D, dtype):
    errors = gradient_errors(FUNCTIONS[name], B, H, Lq, Lk, D, dtype)
    assert max(errors.values()) < TOLERANCE[dtype], errors


@pytest.mark.parametrize("name", FUNCTIONS)
def test_relative_errors_of_every_gradient(name):
    # The shared helper's measure: ||got - ref|| / ||ref|| of o, dq, dk, dv in float32, a custom scale.
    q, k, v = model_qkv(2, 2, 21, 13, 16, torch.float32)
    fn = lambda a, b, c: FUNCTIONS[name](a, b, c, 0.2)  # noqa: E731
    reference = lambda a, b, c: reference_attention(a, b, c, 0.2)[0]  # noqa: E731
    check_against_float64(fn, reference, (q, k, v), torch.randn_like(q), 1e-5, ("o", "dq", "dk", "dv"))


@pytest.mark.parametrize("name", FUNCTIONS)
def test_large_inputs_give_finite_gradients(name):
    # Scores of ~1e3 saturate the softmax: dQ and dK are then tiny differences of large terms and
    # ill-conditioned in any float format, so beyond being finite only o and dV are held tight.
    errors = gradient_errors(FUNCTIONS[name], 1, 2, 33, 45, 16, torch.float32, scale_inputs=100.0)
    assert errors["o"] < 1e-5 and errors["dv"] < 1e-2 and max(errors.values()) < 0.2, errors


def test_query_chunks_split_short_keys_and_stay_whole_for_long_keys():
    align = 128 if GPU else _INTERPRETER_CONFIG["BLOCK_M"]
    assert _plan_query_chunks(Lq=100_000, Lk=100_000, n_bh=8) >= 100_000
    chunk = _plan_query_chunks(Lq=2_570, Lk=170, n_bh=2)
    assert chunk < 2_570 and chunk % align == 0


def test_both_backwards_are_deterministic_and_agree():
    q, k, v = (t.requires_grad_() for t in model_qkv(1, 2, 100, 70, 16, torch.float16))
    do = torch.randn_like(q)
    results = {}
    for name, fn in FUNCTIONS.items():
        first = torch.autograd.grad(fn(q, k, v), (q, k, v), do)
        second = torch.autograd.grad(fn(q, k, v), (q, k, v), do)
        assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True)), name
        results[name] = first
    pairs = zip(results["two-pass"], results["fused"], strict=True)
    assert all(torch.allclose(a.float(), b.float(), atol=2e-3) for a, b in pairs)


def test_records_name_every_launch():
    q, k, v = (t.requires_grad_() for t in model_qkv(1, 1, 9, 5, 16, torch.float32))
    two_pass, fused = ConfigRecord(), ConfigRecord()
    attention(q, k, v, record=two_pass).sum().backward()
    fused_attention(q, k, v, record=fused).sum().backward()
    assert set(two_pass.picked) == {"forward", "dkdv", "dq"}
    assert {"forward", "fused"} <= set(fused.picked)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_bad_input_is_a_clear_value_error(name):
    q, k, v = model_qkv(1, 2, 4, 4, 16, torch.float32)
    with pytest.raises(ValueError, match="v: 3 keys"):
        FUNCTIONS[name](q, k, v[:, :, :3])
    with pytest.raises(ValueError, match="scale"):
        FUNCTIONS[name](q, k, v, float("nan"))


def model_gradient_errors(attend, dtype: str = "fp32", seed: int = 0) -> dict:
    """The TransformerNP with ``attend`` against the same model on SDPA: the loss's relative
    difference and the largest relative difference over every parameter gradient (a small model on
    the tiny shape; on a GPU bf16 under autocast)."""
    from tritonlab.models import (
        Components,
        TNPConfig,
        autocast,
        build,
        check_dtype,
        resolve_shape,
        sample_tasks,
        sdpa_attention,
    )

    cfg = TNPConfig(n_layers=2, n_heads=2, head_dim=16, d_ff=48, n_components=3, d_head_hidden=24)
    shape = resolve_shape("tiny")
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    tasks = sample_tasks(shape.batch, shape.m_context, shape.n_target, device=DEVICE, generator=gen)
    backend = "cudnn" if GPU and dtype == "bf16" else "math"
    results = []
    for fn in (attend, sdpa_attention(backend)):
        model, _ = build(cfg, Components(attention=fn), seed=seed, device=DEVICE)
        with autocast(check_dtype(dtype)):
            loss = model.loss(*tasks)
        loss.backward()
        results.append((loss.detach().double(), {n: p.grad.double() for n, p in model.named_parameters()}))
    (loss, grads), (loss_ref, grads_ref) = results
    grad_err = max(
        (grads[n] - g).abs().max().item() / g.abs().max().clamp_min(1e-12).item()
        for n, g in grads_ref.items()
    )
    return {"loss": abs(loss - loss_ref).item() / abs(loss_ref).item(), "grads": grad_err}


@pytest.mark.parametrize("name", FUNCTIONS)
def test_plugged_into_the_model_matches_sdpa(name):
    errors = model_gradient_errors(FUNCTIONS[name])
    assert errors["loss"] < 1e-5 and errors["grads"] < 1e-4, errors


# --- torch.compile: the custom ops --------------------------------------------------------------


def _reference(q, k, v):
    return reference_attention(q, k, v)[0]


def _deterministic_fused(q, k, v):
    return fused_attention(q, k, v, deterministic=True)


@pytest.mark.parametrize("name", [*FUNCTIONS, "fused-deterministic"])
def test_compiled_matches_eager_and_float64(name, compiled_matches_eager):
    # Odd lengths, the model's strided views; the same kernels run eager and compiled.
    q, k, v = model_qkv(2, 3, 21, 13, 16, torch.float32)
    do = torch.randn_like(q)
    fn = _deterministic_fused if name == "fused-deterministic" else FUNCTIONS[name]
    compiled = compiled_matches_eager(fn, (q, k, v), do, 1e-6)
    check_against_float64(compiled, _reference, (q, k, v), do, 1e-5, ("o", "dq", "dk", "dv"))


@pytest.mark.parametrize("prefix", ["attention", "fused_attention", "deterministic_fused_attention"])
def test_custom_ops_fake_matches_real(prefix, custom_op_checks):
    q, k, v = model_qkv(2, 2, 19, 7, 16, torch.float32)
    forward = getattr(torch.ops.tritonlab, f"{prefix}_forward")
    custom_op_checks(forward, *(t.detach().requires_grad_() for t in (q, k, v)), 0.3)
    o, lse = forward(q, k, v, 0.3)
    backward = getattr(torch.ops.tritonlab, f"{prefix}_backward")
    custom_op_checks(backward, q, k, v, o, lse, torch.randn_like(o), 0.3)


def _packed_inputs(B, H, Lq, Lk, D, dtype, seed=0):
    """q as the model's strided view and kv (B, Lk, 2, H, D), as W_KV projects it, with dO."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(B, Lq, H, D, generator=g, device=DEVICE).to(dtype).transpose(1, 2)
    kv = torch.randn(B, Lk, 2, H, D, generator=g, device=DEVICE).to(dtype)
    return q, kv, torch.randn(B, H, Lq, D, generator=g, device=DEVICE).to(dtype)


def _split_attention(q, kv):
    return reference_attention(q, kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2))[0]


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize(
    ("B", "H", "Lq", "Lk", "D", "dtype"),
    [(1, 1, 1, 2, 16, torch.float32), (2, 3, 37, 100, 32, torch.float32), (1, 2, 257, 17, 64, torch.float16)],
)
def test_packed_kv_is_fused_attention_over_its_halves(B, H, Lq, Lk, D, dtype, deterministic):
    """fused_attention_kv(q, kv): fused_attention's output and gradients, bit for bit where the backward
    is deterministic -- kv's gradient holding dK and dV interleaved as kv holds K and V -- on poisoned
    outputs, and within the fused tolerance of float64."""
    q, kv, do = _packed_inputs(B, H, Lq, Lk, D, dtype)
    q1, kv1 = (t.detach().requires_grad_() for t in (q, kv))
    with poisoned_empty():
        o = fused_attention_kv(q1, kv1, deterministic=deterministic)
        dq, dkv = torch.autograd.grad(o, (q1, kv1), do)
    q2, kv2 = (t.detach().requires_grad_() for t in (q, kv))
    o2 = fused_attention(q2, kv2[:, :, 0].transpose(1, 2), kv2[:, :, 1].transpose(1, 2), deterministic=True)
    dq2, dkv2 = torch.autograd.grad(o2, (q2, kv2), do)
    assert dkv.shape == kv.shape and dkv.is_contiguous()
    if deterministic:
        for got, want in ((o, o2), (dq, dq2), (dkv, dkv2)):
            assert torch.equal(got, want)
    check_against_float64(
        lambda q, kv: fused_attention_kv(q, kv, deterministic=deterministic), _split_attention, (q, kv), do,
        TOLERANCE[dtype], ("o", "dq", "dkv"),
    )  # fmt: skip


def test_packed_kv_compiles_and_its_ops_fake_their_outputs(compiled_matches_eager, custom_op_checks):
    q, kv, do = _packed_inputs(2, 3, 21, 13, 16, torch.float32)
    compiled = compiled_matches_eager(fused_attention_kv, (q, kv), do, 1e-6)
    check_against_float64(compiled, _split_attention, (q, kv), do, 1e-5, ("o", "dq", "dkv"))
    forward = torch.ops.tritonlab.fused_attention_kv_forward
    custom_op_checks(forward, q.detach().requires_grad_(), kv.detach().requires_grad_(), 0.3)
    o, lse = forward(q, kv, 0.3)
    custom_op_checks(torch.ops.tritonlab.fused_attention_kv_backward, q, kv, o, lse, do, 0.3)


@pytest.mark.parametrize("shape", [(1, 5, 1, 1, 16), (1, 5, 3, 1, 16), (5, 2, 1, 16)])
def test_packed_kv_must_be_packed(shape):
    q = torch.randn(1, 1, 4, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"kv: expected K and V packed as \(B, Lk, 2, H, D\)"):
        fused_attention_kv(q, torch.randn(shape, device=DEVICE))


@pytest.mark.parametrize("name", FUNCTIONS)
def test_a_record_is_refused_under_compile(name):
    q, k, v = model_qkv(1, 1, 5, 3, 16, torch.float32)
    record = ConfigRecord()
    compiled = torch.compile(
        lambda *qkv: FUNCTIONS[name](*qkv, record=record), fullgraph=True, backend="eager"
    )
    # A ValueError, which Dynamo (fullgraph=True) re-raises as an "Observed exception" quoting it.
    message = f"record: {FUNCTIONS[name].__name__} cannot fill a ConfigRecord under torch.compile"
    with pytest.raises(Exception, match=message):
        compiled(q, k, v)


class _Compiled:
    def __init__(self, n_spills):
        self.n_spills = n_spills


def test_spilling_configs_are_pruned():
    spills = {"a": 30, "b": 0, "c": 8, "d": 0}

    def compile_for_call(config):
        if config == "too-big":
            raise OutOfResources(300_000, 232_448, "shared memory")
        return _Compiled(spills[config])

    assert _drop_spilling(["a", "b", "too-big", "c", "d"], compile_for_call) == ["b", "d"]
    # Every config spills: the least-spilling one, so that the call still runs (and is reported).
    assert _drop_spilling(["a", "c", "too-big"], compile_for_call) == ["c"]


# --- GPU ---------------------------------------------------------------------------------------

GPU_SHAPES = [(1, 1, 1, 1), (2, 3, 17, 100), (1, 2, 257, 17), (2, 3, 100, 257), (1, 8, 1100, 1000)]
# A slice of the TransformerNP's shapes (H = 8): small's geometry, and shortened mid's.
MODEL_SHAPES = [(8, 8, 564, 64), (1, 8, 1100, 1000), (1, 8, 2048, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize(("B", "H", "Lq", "Lk"), GPU_SHAPES)
def test_gradients_bf16_on_gpu(name, B, H, Lq, Lk):
    errors = gradient_errors(FUNCTIONS[name], B, H, Lq, Lk, 64, torch.bfloat16)
    assert max(errors.values()) < TOLERANCE[torch.bfloat16], errors
    errors = gradient_errors(FUNCTIONS[name], B, H, Lq, Lk, 64, torch.bfloat16, scale_inputs=100.0)
    assert errors["o"] < TOLERANCE[torch.bfloat16], errors  # finite gradients: checked inside


@pytest.mark.gpu
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("D", [16, 32, 64, 128])
@pytest.mark.parametrize(("B", "H", "Lq", "Lk"), MODEL_SHAPES)
def test_gradients_float32_at_model_shapes_on_gpu(name, D, B, H, Lq, Lk):
    # IEEE float32 dots under torch's default "highest" (no OutOfResources: the config spaces are
    # pruned by element size and shared memory), against float64 at a float32 tolerance.
    assert torch.get_float32_matmul_precision() == "highest"
    errors = gradient_errors(FUNCTIONS[name], B, H, Lq, Lk, D, torch.float32)
    assert max(errors.values()) < 1e-4, errors


@pytest.mark.gpu
@pytest.mark.parametrize("name", FUNCTIONS)
def test_float32_honours_high_precision_on_gpu(name):
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:  # TF32 allowed: the error may grow, the call must run
        errors = gradient_errors(FUNCTIONS[name], 1, 8, 1100, 1000, 64, torch.float32)
        assert max(errors.values()) < 2e-2, errors
    finally:
        torch.set_float32_matmul_precision(previous)


@pytest.mark.gpu
def test_fused_kernel_does_not_spill():
    record = ConfigRecord()
    q, k, v = (t.requires_grad_() for t in model_qkv(2, 8, 1100, 1000, 64, torch.bfloat16))
    fused_attention(q, k, v, record=record).sum().backward()
    assert record.picked["n_spills"] == "0", record


@pytest.mark.gpu
@pytest.mark.parametrize("name", FUNCTIONS)
def test_plugged_into_the_model_matches_sdpa_bf16_on_gpu(name):
    errors = model_gradient_errors(FUNCTIONS[name], dtype="bf16")
    assert errors["loss"] < 2e-2 and errors["grads"] < 5e-2, errors


@pytest.mark.gpu
@pytest.mark.parametrize("name", FUNCTIONS)
def test_inductor_bf16_matches_eager_and_float64_on_gpu(name, compiled_matches_eager):
    # The small shape's geometry (B = 8 tasks of M = 64 context and 500 targets, H = 8, D = 64).
    B, H, Lq, Lk, D = 8, 8, 564, 64, 64
    q, k, v = model_qkv(B, H, Lq, Lk, D, torch.bfloat16)
    compiled = compiled_matches_eager(FUNCTIONS[name], (q, k, v), torch.randn_like(q), 1e-3, "inductor")
    errors = gradient_errors(compiled, B, H, Lq, Lk, D, torch.bfloat16)
    assert max(errors.values()) < TOLERANCE[torch.bfloat16], errors


@pytest.mark.gpu
@pytest.mark.parametrize("name", FUNCTIONS)
def test_mid_shape_matches_sdpa_on_gpu(name):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (t.detach().requires_grad_() for t in model_qkv(4, 8, 11_000, 10_000, 64, torch.bfloat16))
    do = torch.randn_like(q)
    with poisoned_empty():
        o = FUNCTIONS[name](q, k, v)
        grads = torch.autograd.grad(o, (q, k, v), do)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o_ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        grads_ref = torch.autograd.grad(o_ref, (q, k, v), do)
    assert (o.float() - o_ref.float()).abs().max().item() < 1e-2
    for a, b in zip(grads, grads_ref, strict=True):
        assert (a.float() - b.float()).abs().max().item() / b.float().abs().max().item() < 3e-2


@pytest.mark.gpu
@pytest.mark.parametrize("name", FUNCTIONS)
def test_direct_launches_follow_alignment_and_scale_on_gpu(name):
    # After the first call of a signature the kernels are launched directly from a cache keyed on the
    # layouts of q, k, v, do: a misaligned view must get its own entry, and a new scale must reach it.
    B, H, Lq, Lk, D = 1, 2, 100, 70, 64
    gradient_errors(FUNCTIONS[name], B, H, Lq, Lk, D, torch.bfloat16)  # aligned
    sizes = (B * H * Lq * D, B * H * Lk * D, B * H * Lk * D)
    for scale in (None, None, 0.05):
        flat = torch.randn(sum(sizes) + 1, dtype=torch.bfloat16, device=DEVICE)[1:]
        q, k, v = (t.view(B, H, -1, D).requires_grad_() for t in flat.split(sizes))
        do = torch.randn_like(q)
        grads = torch.autograd.grad(FUNCTIONS[name](q, k, v, scale), (q, k, v), do)
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        grads64 = torch.autograd.grad(
            reference_attention(q64, k64, v64, scale)[0], (q64, k64, v64), do.double()
        )
        for g, g64 in zip(grads, grads64, strict=True):
            assert (g.double() - g64).abs().max().item() / max(g64.abs().max().item(), 1) < TOLERANCE[
                torch.bfloat16
            ]


@pytest.mark.parametrize("three_d", [False, True])
def test_delta_launch_zeroes_the_dq_sum_in_any_strides(three_d):
    """Δ = rowsum(dO ∘ O) against float64, and the fused backward's float32 dQ sum -- poisoned, in the
    model's (B, L, H, D) storage or flash2's (B, 1, L, D) -- all zeros after the same launch, the
    rows past the last full tile included (Lq = 67)."""
    B, H, Lq, D = 2, (1 if three_d else 3), 67, 32
    q, _, _ = model_qkv(B, H, Lq, 5, D, torch.float16)
    o, do = q * 0.5, torch.randn_like(q)
    zero = torch.full((B, Lq, H, D), float("nan"), device=DEVICE).transpose(1, 2)
    if three_d:
        o, do, zero = o[:, 0], do[:, 0], zero.contiguous()
    delta = backward_delta(o, do, zero=zero)
    assert delta.shape == o.shape[:-1]
    torch.testing.assert_close(delta.double(), (o.double() * do.double()).sum(-1), rtol=1e-5, atol=1e-5)
    assert (zero == 0).all()
