"""Phase autoselect's training order and cold-start probe, on the CPU's tiny size: the three ways
interleaved give each the losses it has alone, a failing way or a model too many for the memory
does not stop the others, and a failing probe is a row that says why."""

import pytest
import torch

from common import ON_GPU
from phases.__main__ import phase_module
from tritonlab import autoselect

cpu_only = pytest.mark.skipif(ON_GPU, reason="the CPU's tiny size, in fp32")


@pytest.fixture(scope="module")
def bench():
    return phase_module("autoselect", "bench")


@pytest.fixture(scope="module")
def plan(bench):
    return bench.Plan("tiny", "fp32", batch=2, context=16, steps=3, warmup=1)


@pytest.fixture(scope="module")
def selection(bench, plan):
    """PyTorch for every op, forced: no timing, so the autoselect way is cheap to build and train."""
    model = bench.build(plan, "pytorch")
    force = dict.fromkeys(autoselect.OP_NAMES, False)
    return autoselect.select(model, bench.batches(plan)[0], force=force, cache=False, log=False)


def _spy_on_steps(bench, monkeypatch, fail=None) -> list[str]:
    """The way of every step taken, in order (``build`` tags each model with its way); ``fail``:
    (way, its step number, the error) to raise instead of that step."""
    real_build, real_step, taken = bench.build, bench.step, []

    def build(plan, way):
        model = real_build(plan, way)
        model.way = way
        return model

    def step(model, optimizer, batch, dtype):
        taken.append(model.way)
        if fail is not None and model.way == fail[0] and taken.count(model.way) == fail[1]:
            raise fail[2]
        return real_step(model, optimizer, batch, dtype)

    monkeypatch.setattr(bench, "build", build)
    monkeypatch.setattr(bench, "step", step)
    return taken


def test_the_way_that_steps_first_rotates_per_batch(bench):
    assert [bench.rotation(i) for i in range(4)] == [
        ["pytorch", "triton", "autoselect"],
        ["triton", "autoselect", "pytorch"],
        ["autoselect", "pytorch", "triton"],
        ["pytorch", "triton", "autoselect"],
    ]
    assert bench.rotation(3, ["pytorch", "autoselect"]) == ["autoselect", "pytorch"]


@cpu_only
def test_interleaved_training_gives_each_way_the_losses_it_has_alone(bench, plan, selection, monkeypatch):
    data = bench.batches(plan)
    taken = _spy_on_steps(bench, monkeypatch)
    interleaved = bench.train_interleaved(plan, data, selection)
    assert taken == [way for i in range(plan.steps) for way in bench.rotation(i)]
    alone = bench.train_sequential(plan, data, selection)
    for way in bench.WAYS:
        times, losses = interleaved[way]
        assert len(times) == plan.steps and all(t > 0 for t in times)
        assert losses == pytest.approx(alone[way][1], rel=1e-6), way
    rows = bench.way_rows(plan, interleaved, dict.fromkeys(bench.WAYS, "interleaved"))
    assert [(r["variant"], r["order"]) for r in rows] == [(w, "interleaved") for w in bench.WAYS]


@cpu_only
def test_a_way_that_raises_leaves_the_rotation_and_the_others_go_on(bench, plan, selection, monkeypatch):
    taken = _spy_on_steps(bench, monkeypatch, fail=("triton", 2, RuntimeError("a kernel broke")))
    outcome = bench.train_interleaved(plan, bench.batches(plan), selection)
    # Batch 1 starts at triton, which raises; batch 2 rotates over the two ways left (2 % 2: pytorch).
    assert taken == [*bench.rotation(0), "triton", "autoselect", "pytorch", "pytorch", "autoselect"]
    assert outcome["triton"]["status"] == "error" and "a kernel broke" in outcome["triton"]["error"]
    assert all(len(outcome[way][1]) == plan.steps for way in ("pytorch", "autoselect"))
    rows = bench.way_rows(plan, outcome, dict.fromkeys(bench.WAYS, "interleaved"))
    assert [r.get("status", "ok") for r in rows] == ["ok", "error", "ok"]


@cpu_only
@pytest.mark.parametrize("where", ["build", "step"])
def test_three_models_that_do_not_fit_train_as_the_goals_pair_then_triton(
    bench, plan, selection, monkeypatch, where
):
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory")
    taken = _spy_on_steps(bench, monkeypatch, fail=("autoselect", 1, oom) if where == "step" else None)
    spied_build, built = bench.build, []

    def build(plan, way):  # the third model of the interleaved run does not fit
        built.append(way)
        if where == "build" and len(built) == 3:
            raise oom
        return spied_build(plan, way)

    monkeypatch.setattr(bench, "build", build)
    rows = bench.train_ways(plan, bench.batches(plan), selection)
    assert built == [*bench.WAYS, *bench.PAIR, "triton"]  # built again from the start
    orders = {"pytorch": "interleaved pair", "triton": "alone", "autoselect": "interleaved pair"}
    assert [(r["variant"], r["order"]) for r in rows] == list(orders.items())
    assert all("error" not in r and len(r["losses"].split(";")) == plan.steps for r in rows)
    # The pair in turn on each batch, then all-Triton's steps together.
    expected = [way for i in range(plan.steps) for way in bench.rotation(i, bench.PAIR)] + [
        "triton"
    ] * plan.steps
    assert taken[-len(expected) :] == expected


@cpu_only
def test_models_that_do_not_fit_even_in_pairs_train_one_after_another(bench, plan, selection, monkeypatch):
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory")
    taken = _spy_on_steps(bench, monkeypatch)
    spied_build, built = bench.build, []

    def build(plan, way):  # a second model alive at once does not fit
        built.append(way)
        if len(built) in (3, 5):
            raise oom
        return spied_build(plan, way)

    monkeypatch.setattr(bench, "build", build)
    rows = bench.train_ways(plan, bench.batches(plan), selection)
    assert built == [*bench.WAYS, *bench.PAIR, *bench.WAYS]
    assert [(r["variant"], r["order"]) for r in rows] == [(w, "sequential") for w in bench.WAYS]
    assert all("error" not in r and len(r["losses"].split(";")) == plan.steps for r in rows)
    sequential = [way for way in bench.WAYS for _ in range(plan.steps)]
    assert taken[-len(sequential) :] == sequential


@cpu_only
def test_a_probe_that_fails_is_a_failure_row_that_says_why(bench):
    row = bench.cold_start_row(bench.Plan("huge", "fp32", 2, 16, 1, 0), repeats=1)
    assert row["variant"] == "cold-start" and row["status"] == "error"
    assert "probe --size huge --way autoselect failed (exit 2)" in row["error"]
    assert "invalid choice: 'huge'" in row["error"]  # the probe's own last line on stderr
