"""tritonlab.attention.attention_forward against float64 attention: odd shapes, every head dim,
strided inputs, poisoned outputs, bad input; on the GPU bf16 and float32 at the model's shapes."""

import threading

import pytest
import torch

from tritonlab._runtime import kernel_device_type
from tritonlab.attention import HEAD_DIMS, IMPLS, attention_forward, reference_attention
from tritonlab.testing import model_qkv, poisoned_empty, rel_err
from tritonlab.tuning import ConfigRecord

DEVICE = kernel_device_type()
GPU = DEVICE == "cuda"
# The Triton kernel's loaders; the Gluon kernel ("gluon", Hopper only) has its own tests.
TRITON_IMPLS = tuple(i for i in IMPLS if i != "gluon")
# On the CPU the interpreter's bf16 dots are wrong, so CPU tests run fp32 and fp16.
TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def check_forward(B, H, Lq, Lk, D, dtype, impl="auto", scale_inputs=1.0, scale=None, tol=None):
    q, k, v = model_qkv(B, H, Lq, Lk, D, dtype, scale_inputs)
    with poisoned_empty():
        o, lse = attention_forward(q, k, v, scale, impl=impl)
    o_ref, lse_ref = reference_attention(q, k, v, scale)
    assert o.shape == q.shape and o.dtype == dtype and lse.shape == (B, H, Lq) and lse.dtype == torch.float32
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    tol = tol or TOLERANCE[dtype]
    o_err = (o.double() - o_ref).abs().max().item() / o_ref.abs().max().item()
    lse_err = ((lse.double() - lse_ref).abs() / lse_ref.abs().clamp_min(1.0)).max().item()
    assert o_err < tol, f"o: relative error {o_err:.2e}"
    assert lse_err < tol, f"lse: relative error {lse_err:.2e}"
    return o_err


@pytest.mark.parametrize("impl", TRITON_IMPLS)
@pytest.mark.parametrize(
    ("B", "H", "Lq", "Lk", "D", "dtype"),
    [
        (1, 1, 1, 1, 16, torch.float32),
        (2, 3, 17, 100, 32, torch.float32),
        (1, 2, 257, 17, 64, torch.float16),
        (3, 2, 100, 57, 16, torch.float16),
        (1, 1, 40, 33, 128, torch.float32),
    ],
)
def test_forward_matches_float64(B, H, Lq, Lk, D, dtype, impl):
    check_forward(B, H, Lq, Lk, D, dtype, impl)


def test_forward_custom_scale_and_large_inputs_do_not_overflow():
    check_forward(1, 2, 33, 70, 32, torch.float32, "tma", scale_inputs=100.0)
    check_forward(1, 1, 17, 40, 16, torch.float16, "blockptr", scale=0.3)


@pytest.mark.parametrize("impl", TRITON_IMPLS)
def test_forward_reads_any_strides(impl):
    # D not unit-stride (every other element): block pointers take it, TMA falls back to them.
    B, H, Lq, Lk, D = 1, 2, 19, 23, 16
    wide = torch.randn(B, H, Lq + Lk + Lk, 2 * D, device=DEVICE)
    q, k, v = wide[:, :, :Lq, ::2], wide[:, :, Lq : Lq + Lk, 1::2], wide[:, :, Lq + Lk :, ::2]
    o, lse = attention_forward(q, k, v, impl=impl)
    o_ref, lse_ref = reference_attention(q, k, v)
    assert torch.allclose(o.double(), o_ref, atol=2e-5)
    assert torch.allclose(lse.double(), lse_ref, atol=2e-5)


def test_output_layout_makes_the_model_reshape_free():
    q, k, v = model_qkv(2, 2, 9, 5, 16, torch.float32)
    o, _ = attention_forward(q, k, v)
    assert o.transpose(1, 2).reshape(2, 9, 32).data_ptr() == o.data_ptr()


def test_the_record_names_the_forward_config():
    record = ConfigRecord()
    attention_forward(*model_qkv(1, 1, 9, 5, 16, torch.float32), record=record)
    assert set(record.picked) == {"forward"} and "BLOCK_M=" in record.picked["forward"]


def _t(*shape, dtype=torch.float32, device=DEVICE):
    return (
        torch.randn(*shape, dtype=dtype, device=device)
        if device != "meta"
        else torch.empty(*shape, device="meta")
    )


@pytest.mark.parametrize(
    ("q", "k", "v", "scale", "match"),
    [
        (_t(1, 2, 4, 16), _t(2, 2, 4, 16), _t(2, 2, 4, 16), None, "k: batch and heads"),
        (_t(1, 2, 4, 16), _t(1, 3, 4, 16), _t(1, 3, 4, 16), None, "k: batch and heads"),
        (_t(1, 2, 4, 16), _t(1, 2, 4, 32), _t(1, 2, 4, 32), None, "head dim"),
        (_t(1, 2, 4, 48), _t(1, 2, 4, 48), _t(1, 2, 4, 48), None, "q: unsupported head dim"),
        (_t(1, 2, 4, 16), _t(1, 2, 5, 16), _t(1, 2, 4, 16), None, "v:"),
        (_t(2, 4, 16), _t(2, 4, 16), _t(2, 4, 16), None, "q: expected 4 dimensions"),
        (
            _t(1, 2, 4, 16).double(),
            _t(1, 2, 4, 16).double(),
            _t(1, 2, 4, 16).double(),
            None,
            "unsupported dtype",
        ),
        (_t(1, 2, 4, 16), _t(1, 2, 4, 16).half(), _t(1, 2, 4, 16), None, "k: dtype .* differs"),
        (_t(1, 2, 4, 16), _t(1, 2, 4, 16, device="meta"), _t(1, 2, 4, 16), None, "device"),
        (_t(1, 2, 0, 16), _t(1, 2, 4, 16), _t(1, 2, 4, 16), None, ">= 1"),
        (_t(1, 2, 4, 16), _t(1, 2, 4, 16), _t(1, 2, 4, 16), -1.0, "scale"),
        ([[1.0]], _t(1, 2, 4, 16), _t(1, 2, 4, 16), None, "q: expected a torch.Tensor"),
    ],
)
def test_bad_input_is_a_clear_value_error(q, k, v, scale, match):
    with pytest.raises(ValueError, match=match):
        attention_forward(q, k, v, scale)


def test_bad_impl_is_a_clear_value_error():
    with pytest.raises(ValueError, match="impl: unknown 'cp.async'"):
        attention_forward(*model_qkv(1, 1, 4, 4, 16, torch.float32), impl="cp.async")


# --- GPU ---------------------------------------------------------------------------------------

# A slice of the TransformerNP's shapes (H = 8, D = 64): small's and a shortened mid's geometry.
MODEL_SHAPES = [(8, 8, 564, 64), (1, 8, 1100, 1000), (1, 8, 2048, 10_000)]


@pytest.mark.gpu
@pytest.mark.parametrize("impl", TRITON_IMPLS)
@pytest.mark.parametrize(
    ("B", "H", "Lq", "Lk"),
    [(1, 1, 1, 1), (2, 3, 17, 100), (1, 2, 257, 17), (2, 3, 100, 257), (1, 8, 1100, 1000)],
)
def test_forward_bf16_on_gpu(B, H, Lq, Lk, impl):
    check_forward(B, H, Lq, Lk, 64, torch.bfloat16, impl)
    check_forward(B, H, Lq, Lk, 64, torch.bfloat16, impl, scale_inputs=100.0)


@pytest.mark.gpu
@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize(("B", "H", "Lq", "Lk"), MODEL_SHAPES)
def test_forward_float32_at_model_shapes_on_gpu(B, H, Lq, Lk, D):
    # IEEE float32 dots under torch's default "highest": float32 rounding only, no TF32.
    assert torch.get_float32_matmul_precision() == "highest"
    check_forward(B, H, Lq, Lk, D, torch.float32)


@pytest.mark.gpu
def test_forward_float32_honours_high_precision_on_gpu():
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:  # TF32 allowed: the error may grow to TF32's, but the call runs and stays close
        check_forward(1, 8, 1100, 1000, 64, torch.float32, tol=5e-3)
    finally:
        torch.set_float32_matmul_precision(previous)


@pytest.mark.gpu
def test_forward_mid_shape_within_spec_of_sdpa():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = model_qkv(4, 8, 11_000, 10_000, 64, torch.bfloat16)
    with poisoned_empty():
        o, _ = attention_forward(q, k, v)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o_sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert (o.float() - o_sdpa.float()).abs().max().item() < 1e-2


def misaligned_inputs(B, H, Lq, Lk, D, dtype):
    """Contiguous q, k, v whose data starts one element past a 16-byte boundary."""
    sizes = (B * H * Lq * D, B * H * Lk * D, B * H * Lk * D)
    flat = torch.randn(sum(sizes) + 1, dtype=dtype, device=DEVICE)[1:]
    q, k, v = flat.split(sizes)
    return q.view(B, H, Lq, D), k.view(B, H, Lk, D), v.view(B, H, Lk, D)


@pytest.mark.gpu
def test_direct_launch_respecialises_for_a_misaligned_view():
    # Launches are cached per signature; alignment is part of it, so an aligned call must not
    # hand its binary (which assumes 16-byte aligned rows) to inputs of the same shape that are not.
    B, H, Lq, Lk, D = 1, 2, 100, 70, 64
    attention_forward(*(t.contiguous() for t in misaligned_inputs(B, H, Lq, Lk, D, torch.bfloat16)))
    for _ in range(2):  # the misaligned call, then its own cached launch
        q, k, v = misaligned_inputs(B, H, Lq, Lk, D, torch.bfloat16)
        assert q.data_ptr() % 16 != 0
        o, _ = attention_forward(q, k, v)
        assert rel_err(o, reference_attention(q, k, v)[0]) < TOLERANCE[torch.bfloat16]


@pytest.mark.gpu
def test_tma_forward_runs_in_a_fresh_thread():
    # Triton's allocator (scratch for on-device tensor descriptors) is per thread; autograd runs a
    # checkpoint's recomputed forward in a thread of its own.
    q, k, v = model_qkv(1, 2, 100, 70, 64, torch.bfloat16)
    result = {}
    worker = threading.Thread(target=lambda: result.update(o=attention_forward(q, k, v, impl="tma")[0]))
    worker.start()
    worker.join()
    assert rel_err(result["o"], reference_attention(q, k, v)[0]) < TOLERANCE[torch.bfloat16]


@pytest.mark.skipif(GPU, reason="the interpreter's fixed config")
def test_interpreter_record_says_so():
    record = ConfigRecord()
    attention_forward(*model_qkv(1, 1, 3, 3, 16, torch.float32), record=record)
    assert record.picked["forward"].startswith("interpreter:")
