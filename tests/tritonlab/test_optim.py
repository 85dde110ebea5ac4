"""tritonlab.optim: AdamW against PyTorch's, its device-side step count, the weight shadows it writes
and their currency rule, the linear layers reading them, and bad input.

CPU tests run the kernel in Triton's interpreter. Tolerance against ``torch.optim.AdamW(foreach=False)``:
PyTorch (not capturable on the CPU) computes the bias corrections 1 - b**t in double on the host, the
kernel in float32 on the device (as PyTorch's capturable path does): at t = 1, 1 - 0.999 carries a
float32 relative error up to ~6e-5, i.e. ~3e-5 of one update of size lr. Over 5 steps of lr <= 1e-2
on N(0, 1) parameters that is < 1e-7 of the parameters' size; 1e-6 (norm-wise, unit scale for the
one-element parameter) leaves room for the contraction of multiply-adds.
"""

import functools
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from tritonlab.ops import linear, linears
from tritonlab.optim import AdamW, WeightShadows
from tritonlab.testing import rel_err

SHAPES = [(1,), (7,), (1000,), (4097,), (33, 65)]
TOL = 1e-6


def _params(device="cpu"):
    return [torch.randn(s, device=device, requires_grad=True) for s in SHAPES]


def _clone(params):
    return [p.detach().clone().requires_grad_() for p in params]


def _groups(params, weight_decay):
    # Two groups, different learning rates (the second also without decay where the first has it).
    return [
        {"params": params[:3], "lr": 1e-2, "weight_decay": weight_decay},
        {"params": params[3:], "lr": 3e-3},
    ]


def _run(opt, params, grads):
    for g in grads:
        for p, gi in zip(params, g, strict=True):
            p.grad = gi.clone()
        opt.step()


def _grads(steps, device="cpu"):
    return [[torch.randn(s, device=device) for s in SHAPES] for _ in range(steps)]


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adamw_matches_torch_over_5_steps(weight_decay):
    ref = _params()
    ours = _clone(ref)
    grads = _grads(5)
    ref_opt = torch.optim.AdamW(_groups(ref, weight_decay), weight_decay=0.05, foreach=False)
    opt = AdamW(_groups(ours, weight_decay), weight_decay=0.05)
    _run(ref_opt, ref, grads)
    _run(opt, ours, grads)
    for p, q in zip(ours, ref, strict=True):
        assert rel_err(p.detach(), q.detach(), scale=1.0) <= TOL, (p.shape, rel_err(p.detach(), q.detach()))
        for key in ("exp_avg", "exp_avg_sq"):
            assert rel_err(opt.state[p][key], ref_opt.state[q][key]) <= TOL, key


def test_betas_with_a_large_first_weight_take_lerp_from_the_end():
    # 1 - beta1 >= 0.5: PyTorch's lerp computes g - (g - m)(1 - w); same result within rounding
    ref = _params()
    ours = _clone(ref)
    grads = _grads(3)
    _run(torch.optim.AdamW(ref, lr=1e-2, betas=(0.3, 0.9), foreach=False), ref, grads)
    _run(AdamW(ours, lr=1e-2, betas=(0.3, 0.9)), ours, grads)
    for p, q in zip(ours, ref, strict=True):
        assert rel_err(p.detach(), q.detach(), scale=1.0) <= TOL


def test_an_lr_schedule_is_read_from_the_device_at_every_step():
    # lr changes every step (a schedule): the kernel reads (lr, 1 - lr*wd) from a tensor refilled each
    # step, not a launch scalar that a kept launch would replay
    ref = _params()
    ours = _clone(ref)
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1, foreach=False)
    opt = AdamW(ours, lr=1e-2, weight_decay=0.1)
    for step, g in enumerate(_grads(4)):
        for o in (ref_opt, opt):
            o.param_groups[0]["lr"] = 1e-2 / (step + 1)
        for params, o in ((ref, ref_opt), (ours, opt)):
            for p, gi in zip(params, g, strict=True):
                p.grad = gi.clone()
            o.step()
    for p, q in zip(ours, ref, strict=True):
        assert rel_err(p.detach(), q.detach(), scale=1.0) <= TOL


def test_the_step_count_is_a_float32_tensor_on_the_params_device_per_param():
    params = _params()
    opt = AdamW(params)
    _run(opt, params, _grads(3))
    for p in params:
        step = opt.state[p]["step"]
        assert isinstance(step, torch.Tensor) and step.dtype == torch.float32 and step.device == p.device
        assert step.item() == 3
    assert all(g["capturable"] for g in opt.param_groups)  # GraphedStep's check


def test_params_without_grad_are_skipped_and_state_dicts_round_trip():
    params = _params()
    opt = AdamW(params)
    params[0].grad = torch.randn_like(params[0])
    opt.step()
    assert params[1] not in opt.state and opt.state[params[0]]["step"].item() == 1
    other = AdamW(_clone(params))
    other.load_state_dict(opt.state_dict())
    assert next(iter(other.state.values()))["step"].item() == 1


def test_the_kernel_writes_each_shadow_as_the_updated_param_cast():
    # fp16 shadows: the interpreter truncates bf16 casts, fp16 it rounds to nearest like torch
    params = _params()
    shadows = WeightShadows(params[2:], dtype=torch.float16)
    opt = AdamW(params, lr=1e-2, shadows=shadows)
    _run(opt, params, _grads(2))
    for p in params[2:]:
        got = shadows.get(p, torch.float16)
        assert got is not None and torch.equal(got, p.detach().to(torch.float16))
    assert shadows.get(params[0], torch.float16) is None  # no shadow: none written


def test_shadows_go_stale_on_other_in_place_changes_and_current_again_after_a_step():
    layer = torch.nn.Linear(16, 8, bias=False)
    w = layer.weight
    shadows = WeightShadows([w])
    assert len(shadows) == 1 and w in shadows and shadows.params() == [w]
    assert torch.equal(shadows.get(w, torch.bfloat16), w.detach().to(torch.bfloat16))
    assert shadows.get(w, torch.float16) is None  # another dtype
    assert shadows.get(torch.randn(8, 16), torch.bfloat16) is None  # not held

    with torch.no_grad():
        w.add_(1)
    assert shadows.get(w, torch.bfloat16) is None
    shadows.refresh(stale_only=True)
    assert torch.equal(shadows.get(w, torch.bfloat16), w.detach().to(torch.bfloat16))

    layer.load_state_dict({"weight": torch.randn(8, 16)})
    assert shadows.get(w, torch.bfloat16) is None

    opt = AdamW([w], shadows=shadows)
    w.grad = torch.randn_like(w)
    opt.step()  # writes the shadow through a pointer: current again, without a refresh
    shadow = shadows.get(w, torch.bfloat16)
    assert shadow is not None
    # bf16 in the interpreter truncates: within one bf16 ulp of the rounded cast
    assert torch.allclose(shadow.float(), w.detach(), rtol=2**-7, atol=0)

    torch.optim.SGD([w], lr=0.1).step()  # PyTorch's optimizer bumps _version
    assert shadows.get(w, torch.bfloat16) is None

    shadows.refresh()
    w.data.add_(1)  # documented: .data has a version counter of its own, so this is not seen
    assert shadows.get(w, torch.bfloat16) is not None


def _autocast_linears(x, weights, shadows):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ys = linears(x, weights, shadows)
    sum(y.float().square().sum() for y in ys).backward()
    return [y.detach() for y in ys], [w.grad.clone() for w in weights]


def test_linears_read_current_shadows_under_autocast_with_the_same_result():
    x = torch.randn(3, 5, 32)
    ws = [torch.randn(n, 32, requires_grad=True) for n in (16, 24)]
    ref_ys, ref_gs = _autocast_linears(x, ws, None)
    for w in ws:
        w.grad = None
    shadows = WeightShadows(ws)
    ys, gs = _autocast_linears(x, ws, shadows)
    for y, r in zip(ys, ref_ys, strict=True):
        assert y.dtype == torch.bfloat16 and torch.equal(y, r)
    assert torch.equal(ys[0], F.linear(x.to(torch.bfloat16), shadows.get(ws[0], torch.bfloat16)))
    for g, r, w in zip(gs, ref_gs, ws, strict=True):
        assert g.dtype == w.dtype and torch.equal(g, r)


def test_linear_reads_the_shadow_not_a_cast_and_falls_back_when_stale():
    x = torch.randn(4, 32)
    w = torch.randn(16, 32, requires_grad=True)
    shadows = WeightShadows([w])
    shadows.buffer(w).zero_()  # a write that bypasses the version: the shadow is what is read
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(linear(x, w, shadows), torch.zeros(4, 16, dtype=torch.bfloat16))
        with torch.no_grad():
            w.mul_(1)  # stale now: cast as without shadows
        assert torch.equal(linear(x, w, shadows), F.linear(x, w))
    # without autocast the shadow plays no part
    assert torch.equal(linear(x, w, WeightShadows([w])), F.linear(x, w))


def test_our_components_pass_shadows_to_the_linear_layers():
    from tritonlab.models import TransformerLM, lm_config, our_components, random_batch, torch_components
    from tritonlab.models.lm import _linears_triton

    assert our_components().linear is _linears_triton
    shadows = WeightShadows()
    linear_fn = our_components(shadows=shadows).linear
    assert isinstance(linear_fn, functools.partial) and linear_fn.keywords == {"shadows": shadows}
    # PyTorch's components but that linear (no interpreter kernels): every block must read the shadows
    cfg = lm_config("tiny", 16)
    torch.manual_seed(0)
    model = TransformerLM(cfg, replace(torch_components(), linear=linear_fn))
    shadows.add(p for p in model.parameters() if p.dim() == 2)
    tokens, targets = random_batch(cfg, 2, 16, generator=torch.Generator().manual_seed(1))

    def loss():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model.loss(tokens, targets).detach()

    cast = loss()
    last_block_down = model.layers[-1].ffn.w2.weight
    shadows.buffer(last_block_down).zero_()  # the weight and its _version untouched: still "current"
    assert not torch.equal(loss(), cast)  # the block read the shadow, not a cast of the weight
    shadows.refresh()
    assert torch.equal(loss(), cast)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: AdamW([torch.zeros(3, dtype=torch.float16, requires_grad=True)]), "params: .*float16"),
        (lambda: AdamW([torch.zeros(3, requires_grad=True)], amsgrad=True), "amsgrad"),
        (lambda: AdamW([torch.zeros(3, requires_grad=True)], fused=True), "fused"),
        (lambda: AdamW([torch.zeros(3, requires_grad=True)], lr=-1.0), "lr"),
        (lambda: AdamW([torch.zeros(3, requires_grad=True)], lr=torch.tensor(1e-3)), "lr"),
        (lambda: AdamW([torch.zeros(3, requires_grad=True)], betas=(0.9, 1.0)), r"betas\[1\]"),
        (lambda: AdamW([torch.zeros(3, requires_grad=True)], eps=-1.0), "eps"),
        (lambda: AdamW([torch.zeros(3, requires_grad=True)], weight_decay=-1.0), "weight_decay"),
        (lambda: AdamW([torch.zeros(3, requires_grad=True)], shadows=object()), "shadows"),
        (lambda: AdamW([torch.zeros(4, 4).t().requires_grad_()]), "contiguous"),
        (lambda: WeightShadows([torch.zeros(3, dtype=torch.float16)]), r"params\[0\]: .*float32"),
        (lambda: WeightShadows([torch.zeros(3)], dtype=torch.int8), "dtype"),
        (lambda: linear(torch.randn(2, 4), torch.randn(3, 4), shadows=object()), "shadows"),
    ],
)
def test_bad_inputs_are_value_errors_naming_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_a_gradient_of_another_dtype_is_refused_at_the_step():
    p = torch.zeros(3, requires_grad=True)
    opt = AdamW([p])
    p.grad_dtype = None  # PyTorch itself refuses the assignment otherwise
    p.grad = torch.zeros(3, dtype=torch.float16)
    with pytest.raises(ValueError, match="grad: .*float16"):
        opt.step()


# --- on a GPU -----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adamw_matches_torch_fused_adamw_on_cuda_over_5_steps(weight_decay):
    ref = _params("cuda")
    ours = _clone(ref)
    shadows = WeightShadows(ours)
    grads = _grads(5, "cuda")
    ref_opt = torch.optim.AdamW(_groups(ref, weight_decay), weight_decay=0.05, fused=True)
    opt = AdamW(_groups(ours, weight_decay), weight_decay=0.05, shadows=shadows)
    _run(ref_opt, ref, grads)
    _run(opt, ours, grads)
    for p, q in zip(ours, ref, strict=True):
        assert rel_err(p.detach(), q.detach(), scale=1.0) <= TOL
        assert torch.equal(shadows.get(p, torch.bfloat16), p.detach().to(torch.bfloat16))
        assert opt.state[p]["step"].device == p.device and opt.state[p]["step"].item() == 5
