"""attention_with_cudnn_backward: our forward with cuDNN's backward -- refused with a clear error
where cuDNN cannot run; on the GPU, bf16 and fp16 gradients against float64 at odd shapes and the
model's strided layout, D 16 to 128, the configs it records, and torch.compile through its custom op."""

import pytest
import torch

from tritonlab.attention import attention, attention_with_cudnn_backward, reference_attention
from tritonlab.testing import model_qkv
from tritonlab.tuning import ConfigRecord

from .test_backward import DEVICE, GPU, GPU_SHAPES, TOLERANCE, gradient_errors


def test_without_cudnn_or_in_fp32_it_is_a_value_error_naming_q():
    dtype = torch.float32 if GPU else torch.float16
    q, k, v = model_qkv(1, 2, 9, 5, 16, dtype)
    with pytest.raises(ValueError, match=r"q: cuDNN's attention backward needs"):
        attention_with_cudnn_backward(q, k, v)


@pytest.mark.gpu
def test_one_query_over_one_key_is_a_value_error_on_gpu():
    q, k, v = model_qkv(1, 1, 1, 1, 64, torch.bfloat16)
    with pytest.raises(ValueError, match="s_q = s_kv = 1"):
        attention_with_cudnn_backward(q, k, v)


# cuDNN rejects one query over one key (above); (1, 1, 1, 5) and (1, 1, 5, 1) keep the length-1 sides.
CUDNN_SHAPES = [(1, 1, 1, 5), (1, 1, 5, 1), *(s for s in GPU_SHAPES if s != (1, 1, 1, 1))]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("B", "H", "Lq", "Lk"), CUDNN_SHAPES)
def test_gradients_on_gpu(B, H, Lq, Lk, dtype):
    errors = gradient_errors(attention_with_cudnn_backward, B, H, Lq, Lk, 64, dtype)
    assert max(errors.values()) < TOLERANCE[dtype], errors


@pytest.mark.gpu
@pytest.mark.parametrize(("B", "H", "Lq", "Lk"), [(1, 2, 2, 2), (2, 8, 300, 257)])
def test_gradients_with_do_in_the_models_layout_on_gpu(B, H, Lq, Lk):
    # dO as the model hands it back: in o's (B, Lq, H, D) layout, not contiguous (B, H, Lq, D).
    q, k, v = (t.detach().requires_grad_() for t in model_qkv(B, H, Lq, Lk, 64, torch.bfloat16))
    o = attention_with_cudnn_backward(q, k, v)
    do = torch.randn_like(o)
    assert do.stride() == o.stride() and not do.is_contiguous()
    grads = torch.autograd.grad(o, (q, k, v), do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    grads64 = torch.autograd.grad(reference_attention(q64, k64, v64)[0], (q64, k64, v64), do.double())
    for ours, theirs in zip(grads, grads64, strict=True):
        err = (ours.double() - theirs).abs().max().item() / theirs.abs().max().clamp_min(1.0).item()
        assert err < TOLERANCE[torch.bfloat16], err


@pytest.mark.gpu
@pytest.mark.parametrize("D", [16, 32, 64, 128])
def test_every_head_dim_on_gpu(D):
    errors = gradient_errors(attention_with_cudnn_backward, 1, 8, 1100, 1000, D, torch.bfloat16, seed=D)
    assert max(errors.values()) < TOLERANCE[torch.bfloat16], errors


@pytest.mark.gpu
def test_gradients_match_the_two_pass_backward_and_land_in_its_layouts_on_gpu():
    q, k, v = (t.detach().requires_grad_() for t in model_qkv(2, 8, 1100, 1000, 64, torch.bfloat16))
    do = torch.randn(2, 8, 1100, 64, device=DEVICE, dtype=torch.bfloat16)
    record = ConfigRecord()
    ours = torch.autograd.grad(attention_with_cudnn_backward(q, k, v, record=record), (q, k, v), do)
    theirs = torch.autograd.grad(attention(q, k, v), (q, k, v), do)
    for a, b in zip(ours, theirs, strict=True):
        assert a.stride() == b.stride()
        assert ((a.float() - b.float()).norm() / b.float().norm()).item() < 1e-2
    assert record.picked["dkdv"] == record.picked["dq"] == "cudnn"


@pytest.mark.gpu
def test_compiled_matches_eager_on_gpu():
    q, k, v = (t.detach().requires_grad_() for t in model_qkv(1, 4, 300, 257, 64, torch.bfloat16))
    compiled = torch.compile(attention_with_cudnn_backward, fullgraph=True)
    o_c = compiled(q, k, v)
    grads_c = torch.autograd.grad(o_c.float().square().sum(), (q, k, v))
    o_e = attention_with_cudnn_backward(q, k, v)
    grads_e = torch.autograd.grad(o_e.float().square().sum(), (q, k, v))
    torch.testing.assert_close(o_c, o_e)
    for a, b in zip(grads_c, grads_e, strict=True):
        assert ((a.float() - b.float()).norm() / b.float().norm()).item() < 1e-2
