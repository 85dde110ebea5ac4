"""Phase 02's forward against float64 attention: odd shapes, strided inputs, poisoned outputs."""

import importlib
import threading

import pytest
import torch

import common

fwd = importlib.import_module("phases.02_attn_fwd")
ref = importlib.import_module("phases.02_attn_fwd.reference")

DEVICE = common.DEVICE
# On the CPU the interpreter's bf16 dots are wrong, so CPU tests run fp32 and fp16.
TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def check_forward(B, H, Lq, Lk, D, dtype, impl, scale_inputs=1.0, scale=None):
    q, k, v = ref.strided_inputs(B, H, Lq, Lk, D, dtype, DEVICE, scale_inputs)
    with ref.poisoned_allocations():
        o, lse = fwd.attention_forward(q, k, v, scale, impl=impl)
    o_ref, lse_ref = ref.reference_attention(q, k, v, scale)
    assert o.shape == q.shape and o.dtype == dtype and lse.shape == (B, H, Lq) and lse.dtype == torch.float32
    assert not o.isnan().any() and not lse.isnan().any()
    # Absolute error relative to the largest output; lse in relative terms.
    o_err = (o.double() - o_ref).abs().max().item() / o_ref.abs().max().item()
    lse_err = ((lse.double() - lse_ref).abs() / lse_ref.abs().clamp_min(1.0)).max().item()
    assert o_err < TOLERANCE[dtype], f"o: relative error {o_err:.2e}"
    assert lse_err < TOLERANCE[dtype], f"lse: relative error {lse_err:.2e}"


@pytest.mark.parametrize("impl", fwd.IMPLS)
@pytest.mark.parametrize(
    ("B", "H", "Lq", "Lk", "D", "dtype"),
    [
        (1, 1, 1, 1, 16, torch.float32),
        (2, 3, 17, 100, 32, torch.float32),
        (1, 2, 257, 17, 64, torch.float16),
        (3, 2, 100, 257, 16, torch.float16),
        (1, 1, 64, 64, 128, torch.float32),
    ],
)
def test_forward_matches_float64(B, H, Lq, Lk, D, dtype, impl):
    check_forward(B, H, Lq, Lk, D, dtype, impl)


def test_forward_custom_scale_and_large_inputs_do_not_overflow():
    check_forward(1, 2, 33, 70, 32, torch.float32, "tma", scale_inputs=100.0)
    check_forward(1, 1, 17, 40, 16, torch.float16, "blockptr", scale=0.3)


@pytest.mark.parametrize("impl", fwd.IMPLS)
def test_forward_reads_any_strides(impl):
    # D not unit-stride (every other element): block pointers take it, TMA falls back to them.
    B, H, Lq, Lk, D = 1, 2, 19, 23, 16
    wide = torch.randn(B, H, Lq + Lk + Lk, 2 * D, device=DEVICE)
    q, k, v = wide[:, :, :Lq, ::2], wide[:, :, Lq : Lq + Lk, 1::2], wide[:, :, Lq + Lk :, ::2]
    o, lse = fwd.attention_forward(q, k, v, impl=impl)
    o_ref, lse_ref = ref.reference_attention(q, k, v)
    assert torch.allclose(o.double(), o_ref, atol=2e-5)
    assert torch.allclose(lse.double(), lse_ref, atol=2e-5)


def test_output_layout_makes_the_model_reshape_free():
    q, k, v = ref.strided_inputs(2, 2, 9, 5, 16, torch.float32, DEVICE)
    o, _ = fwd.attention_forward(q, k, v)
    flat = o.transpose(1, 2).reshape(2, 9, 32)
    assert flat.data_ptr() == o.data_ptr()


def _t(*shape, dtype=torch.float32, device=DEVICE):
    return (
        torch.randn(*shape, dtype=dtype, device=device)
        if device != "meta"
        else torch.empty(*shape, device="meta")
    )


@pytest.mark.parametrize(
    ("q", "k", "v", "scale", "match"),
    [
        (_t(1, 2, 4, 16), _t(2, 2, 4, 16), _t(2, 2, 4, 16), None, "batch"),
        (_t(1, 2, 4, 16), _t(1, 3, 4, 16), _t(1, 3, 4, 16), None, "heads"),
        (_t(1, 2, 4, 16), _t(1, 2, 4, 32), _t(1, 2, 4, 32), None, "head dim"),
        (_t(1, 2, 4, 48), _t(1, 2, 4, 48), _t(1, 2, 4, 48), None, "unsupported head dim"),
        (_t(1, 2, 4, 16), _t(1, 2, 5, 16), _t(1, 2, 4, 16), None, "v:"),
        (_t(2, 4, 16), _t(2, 4, 16), _t(2, 4, 16), None, "4 dimensions"),
        (
            _t(1, 2, 4, 16).double(),
            _t(1, 2, 4, 16).double(),
            _t(1, 2, 4, 16).double(),
            None,
            "unsupported dtype",
        ),
        (_t(1, 2, 4, 16), _t(1, 2, 4, 16).half(), _t(1, 2, 4, 16), None, "differs"),
        (_t(1, 2, 4, 16), _t(1, 2, 4, 16, device="meta"), _t(1, 2, 4, 16), None, "device"),
        (_t(1, 2, 0, 16), _t(1, 2, 4, 16), _t(1, 2, 4, 16), None, ">= 1"),
        (_t(1, 2, 4, 16), _t(1, 2, 4, 16), _t(1, 2, 4, 16), -1.0, "scale"),
    ],
)
def test_bad_input_is_a_clear_value_error(q, k, v, scale, match):
    with pytest.raises(ValueError, match=match):
        fwd.attention_forward(q, k, v, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", fwd.IMPLS)
@pytest.mark.parametrize(
    ("B", "H", "Lq", "Lk"),
    [(1, 1, 1, 1), (2, 3, 17, 100), (1, 2, 257, 17), (2, 3, 100, 257), (1, 8, 1100, 1000)],
)
def test_forward_bf16_on_gpu(B, H, Lq, Lk, impl):
    check_forward(B, H, Lq, Lk, 64, torch.bfloat16, impl)
    check_forward(B, H, Lq, Lk, 64, torch.bfloat16, impl, scale_inputs=100.0)


@pytest.mark.gpu
def test_forward_mid_shape_within_spec_of_sdpa():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = ref.strided_inputs(4, 8, 11_000, 10_000, 64, torch.bfloat16, DEVICE)
    with ref.poisoned_allocations():
        o, _ = fwd.attention_forward(q, k, v)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o_sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert (o.float() - o_sdpa.float()).abs().max().item() < 1e-2


@pytest.mark.gpu
def test_direct_launch_respecialises_for_a_misaligned_view():
    # Launches are cached per signature; alignment is part of it, so an aligned call must not
    # hand its binary (which assumes 16-byte aligned rows) to inputs of the same shape that are not.
    B, H, Lq, Lk, D = 1, 2, 100, 70, 64
    q, k, v = (t.contiguous() for t in ref.misaligned_inputs(B, H, Lq, Lk, D, torch.bfloat16, DEVICE))
    fwd.attention_forward(q, k, v)  # aligned copies: compiles and caches
    for _ in range(2):  # the misaligned call, then its own cached launch
        q, k, v = ref.misaligned_inputs(B, H, Lq, Lk, D, torch.bfloat16, DEVICE)
        assert q.data_ptr() % 16 != 0
        o, _ = fwd.attention_forward(q, k, v)
        o_ref, _ = ref.reference_attention(q, k, v)
        assert (o.double() - o_ref).abs().max().item() < TOLERANCE[torch.bfloat16]


@pytest.mark.gpu
def test_tma_forward_runs_in_a_fresh_thread():
    # Triton's allocator (scratch for on-device tensor descriptors) is per thread; autograd runs a
    # checkpoint's recomputed forward in a thread of its own.
    q, k, v = ref.strided_inputs(1, 2, 100, 70, 64, torch.bfloat16, DEVICE)
    result = {}
    worker = threading.Thread(target=lambda: result.update(o=fwd.attention_forward(q, k, v, impl="tma")[0]))
    worker.start()
    worker.join()
    o_ref, _ = ref.reference_attention(q, k, v)
    assert (result["o"].double() - o_ref).abs().max().item() < TOLERANCE[torch.bfloat16]
