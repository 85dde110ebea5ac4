"""tritonlab.autoselect: the choice with fake timers (ties, failures, unsupported head dims, forcing,
the cache, new shapes), apply() on stock nn.RMSNorm, the logging table; on a GPU, the swapped
model's outputs and gradients against the original's."""

import copy
import json
import logging
import time
from dataclasses import replace

import pytest
import torch
from torch import nn

from tritonlab import autoselect as auto
from tritonlab.models import LMConfig, TransformerLM, random_batch, torch_components


def timer_of(pytorch_ms, triton_ms, calls=None):
    def timer(fn, trial):
        if calls is not None:
            calls.append(trial)
        return {"pytorch": pytorch_ms, "triton": triton_ms}[trial.impl]

    return timer


def norm_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.RMSNorm(64), nn.Linear(64, 8))


X = torch.randn(4, 32)


@pytest.mark.parametrize(
    ("pt", "tr", "choice", "says"),
    [
        (1.0, 0.5, "triton", "triton faster"),
        (0.5, 1.0, "pytorch", "pytorch faster"),
        (1.0, 0.99, "pytorch", "tie"),
    ],
)
def test_the_faster_wins_and_a_tie_keeps_pytorch(pt, tr, choice, says):
    sel = auto.select(norm_model(), X, timer=timer_of(pt, tr), cache=False)
    (c,) = sel.choices.values()
    assert (c.op, c.choice, c.shapes) == ("rms_norm", choice, "4x64, 64") and says in c.reason
    assert c.speedup == pytest.approx(pt / tr)


def test_a_failing_triton_path_falls_back_with_the_reason(monkeypatch):
    def boom(*args):
        raise RuntimeError("PTX compile failed")

    monkeypatch.setitem(auto.OPS, "rms_norm", replace(auto.OPS["rms_norm"], triton=boom))
    (c,) = auto.select(norm_model(), X, timer=timer_of(1.0, 0.1), cache=False).choices.values()
    assert c.choice == "pytorch" and "compile/launch error" in c.reason and "PTX" in c.reason
    with pytest.raises(auto.AutoselectError, match="rms_norm"):
        auto.select(norm_model(), X, timer=timer_of(1.0, 0.1), cache=False, force={"rms_norm": True})


def test_a_result_that_disagrees_falls_back(monkeypatch):
    monkeypatch.setitem(auto.OPS, "rms_norm", replace(auto.OPS["rms_norm"], triton=lambda x, w, e: 2 * x))
    (c,) = auto.select(norm_model(), X, timer=timer_of(1.0, 0.1), cache=False).choices.values()
    assert c.choice == "pytorch" and "disagrees with PyTorch" in c.reason


def test_head_dim_48_is_unsupported_and_forcing_it_is_an_error():
    cfg = LMConfig(96, 128, 1, 2, context_length=16, vocab_size=64)  # head dim 48
    torch.manual_seed(0)
    model = TransformerLM(cfg, torch_components("sdpa"))
    batch = random_batch(cfg, 1, 8)
    sel = auto.select(model, batch, ops=["attention"], timer=timer_of(1.0, 0.1), cache=False)
    (c,) = sel.choices.values()
    assert c.choice == "pytorch" and "head dim 48" in c.reason
    with pytest.raises(auto.AutoselectError, match="attention.*head dim 48"):
        auto.select(model, batch, ops=["attention"], cache=False, force={"attention": True})


def test_forcing_triton_where_it_cannot_run_is_an_error_naming_the_op(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")  # CPU tensors without the interpreter: Triton cannot run
    (c,) = auto.select(norm_model(), X, timer=timer_of(1.0, 0.1), cache=False).choices.values()
    assert c.choice == "pytorch" and "no CUDA device" in c.reason
    with pytest.raises(auto.AutoselectError, match="rms_norm: forced to Triton.*no CUDA device"):
        auto.select(norm_model(), X, cache=False, force={"rms_norm": True})
    sel = auto.select(norm_model(), X, cache=False, force={"rms_norm": False})
    assert [c.reason for c in sel.choices.values()] == ["forced pytorch"]


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="ops: unknown 'layernorm'"):
        auto.select(norm_model(), X, ops=["layernorm"], cache=False)
    with pytest.raises(ValueError, match="mode"):
        auto.select(norm_model(), X, mode="eval", cache=False)
    with pytest.raises(ValueError, match="force: unknown op 'rmsnorm'"):
        auto.select(norm_model(), X, force={"rmsnorm": True}, cache=False)


def test_a_corrupt_cache_is_ignored_with_a_warning_rewritten_and_reused(tmp_path):
    path = tmp_path / "autoselect.json"
    path.write_text("{not json")
    with pytest.warns(UserWarning, match="corrupt cache"):
        sel = auto.select(norm_model(), X, timer=timer_of(1.0, 0.5), cache=path)
    assert next(iter(sel.choices.values())).choice == "triton"
    entries = json.loads(path.read_text())["entries"]
    assert len(entries) == 1 and "rms_norm" in next(iter(entries))
    calls = []
    sel = auto.select(norm_model(), X, timer=timer_of(0.1, 9.0, calls), cache=path)
    (c,) = sel.choices.values()
    assert calls == [] and c.source == "cache" and c.choice == "triton" and c.triton_ms == 0.5


def test_a_new_shape_in_training_is_selected_once_for_that_shape_only():
    calls = []
    model = norm_model()
    sel = auto.select(model, X, timer=timer_of(1.0, 0.5, calls), cache=False)
    auto.apply(model, sel)
    assert len(calls) == 2
    model(torch.randn(4, 32)).sum().backward()  # the selected shape: no timing
    assert len(calls) == 2
    for _ in range(3):
        model(torch.randn(7, 32)).sum().backward()
    assert len(calls) == 4 and {t.shapes for t in calls[2:]} == {"7x64, 64"}
    assert [c.source for c in sel.choices.values()] == ["timed", "lazy"]


def test_apply_swaps_stock_rmsnorm_in_place_and_matches():
    model = norm_model()
    ref = copy.deepcopy(model)
    weight = model[1].weight
    sel = auto.select(model, X, timer=timer_of(1.0, 0.5), cache=False, log=False)
    auto.apply(model, sel)
    assert isinstance(model[1], nn.RMSNorm) and type(model[1]) is auto.AutoRMSNorm
    assert model[1].weight is weight and list(model.state_dict()) == list(ref.state_dict())
    x = torch.randn(4, 32)
    out, want = model(x), ref(x)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    out.square().sum().backward()
    want.square().sum().backward()
    torch.testing.assert_close(model[1].weight.grad, ref[1].weight.grad, rtol=1e-4, atol=1e-5)
    auto.unapply(model)
    assert type(model[1]) is nn.RMSNorm


def test_apply_swaps_the_lms_components_and_training_runs():
    cfg = LMConfig(32, 64, 1, 2, context_length=16, vocab_size=64)
    torch.manual_seed(0)
    model = TransformerLM(cfg)
    batch = random_batch(cfg, 1, 8)
    sel = auto.select(model, batch, ops=["swiglu", "rms_norm"], timer=timer_of(1.0, 0.5), cache=False)
    assert {c.op: c.choice for c in sel.choices.values()} == {"rms_norm": "triton", "swiglu": "triton"}
    want = model.loss(*batch)
    auto.apply(model, sel, ops=["swiglu", "rms_norm"])
    assert isinstance(model.components.swiglu, auto.Dispatcher)
    loss = model.loss(*batch)
    loss.backward()
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    auto.unapply(model)
    assert not isinstance(model.components.swiglu, auto.Dispatcher)


def test_apply_on_a_fused_add_norm_routes_every_norm_through_the_dispatcher():
    from tritonlab.models import our_components

    cfg = LMConfig(32, 64, 2, 2, context_length=16, vocab_size=64)
    torch.manual_seed(0)
    model = TransformerLM(cfg, our_components())
    fused = model.components.add_norm
    batch = random_batch(cfg, 1, 8)
    want = model.loss(*batch)
    calls = []
    sel = auto.select(model, batch, ops=["rms_norm"], timer=timer_of(1.0, 0.5), cache=False)
    auto.apply(model, sel, ops=["rms_norm"])
    assert model.components.add_norm is None
    dispatcher = model.components.norm
    model.components.norm = lambda *a: calls.append(1) or dispatcher(*a)
    torch.testing.assert_close(model.loss(*batch), want, rtol=1e-5, atol=1e-5)
    assert len(calls) == 2 * cfg.n_layers + 1  # every norm, not only the first block's ln1
    model.components.norm = dispatcher
    auto.unapply(model)
    assert model.components.add_norm is fused and not isinstance(model.components.norm, auto.Dispatcher)


def test_the_logging_table_and_rows(caplog):
    with caplog.at_level(logging.INFO, logger="tritonlab.autoselect"):
        sel = auto.select(norm_model(), X, timer=timer_of(1.0, 0.25), cache=False)
    text = caplog.text
    for word in (
        "op",
        "shapes",
        "PyTorch ms",
        "Triton ms",
        "speedup",
        "using",
        "rms_norm",
        "4.00x",
        "triton",
    ):
        assert word in text
    (row,) = sel.rows()
    assert {"op", "shapes", "dtype", "pytorch_ms", "triton_ms", "speedup", "choice", "reason"} <= set(row)
    assert row["speedup"] == 4.0


def test_the_startup_is_split_into_the_recording_forward_and_each_choice():
    def slow_timer(fn, trial):  # each timing call takes 20 ms of the selection's clock
        time.sleep(0.02)
        return (1.0, 0.0) if trial.impl == "pytorch" else (0.5, 0.0)

    sel = auto.select(norm_model(), X, timer=slow_timer, cache=False, log=False)
    (key,) = sel.choices
    assert sel.forward_s > 0 and sel.select_s[key] >= 0.04  # two timings
    assert sel.forward_s + sel.select_s[key] <= sel.startup_s
    (row,) = sel.rows()
    assert row["select_s"] == sel.select_s[key]
    (checked,) = auto.verify(sel, slow_timer)
    assert checked["select_s"] == sel.select_s[key]


def test_benchmark_kernels_off_takes_triton_where_it_runs_without_timing():
    calls = []
    sel = auto.select(norm_model(), X, timer=timer_of(1.0, 9.0, calls), cache=False, benchmark_kernels=False)
    assert calls == [] and [c.choice for c in sel.choices.values()] == ["triton"]


@pytest.mark.gpu
def test_the_swapped_lm_matches_the_original_on_a_gpu():
    cfg = LMConfig(256, 1024, 2, 4, context_length=256)  # head dim 64
    torch.manual_seed(0)
    with torch.device("cuda"):
        ref = TransformerLM(cfg, torch_components("sdpa"))
    model = copy.deepcopy(ref)
    batch = random_batch(cfg, 4, 256, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        sel = auto.select(model, batch, cache=False, force=dict.fromkeys(auto.OP_NAMES, True))
    auto.apply(model, sel)
    assert all(c.choice == "triton" for c in sel.choices.values())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss, want = model.loss(*batch), ref.loss(*batch)
    loss.backward()
    want.backward()
    torch.testing.assert_close(loss, want, rtol=2e-2, atol=2e-2)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        err = ((p.grad - q.grad).norm() / q.grad.norm()).item()
        assert err < 6e-2, name
