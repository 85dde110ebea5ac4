"""Phase 08's graphed mode: the command line, the report's two sections, and a replay's gradient."""

import pandas as pd
import pytest
import torch

import common
from common.report import Figures
from phases.__main__ import phase_module
from tritonlab.gmm import gmm_nll
from tritonlab.models import gmm_nll as gmm_nll_eager

script = phase_module("08", "__main__")
bench = phase_module("08", "bench")
report = phase_module("08", "report")


# -- the command line ----------------------------------------------------------------------------


def test_graphed_on_defaults_to_none_on_the_cpu_and_is_refused_there(monkeypatch):
    monkeypatch.setattr(script, "ON_GPU", False)
    assert script.parse_args(["--shape", "tiny"]).graphed_on == []
    with pytest.raises(SystemExit):
        script.parse_args(["--shape", "tiny", "--graphed-on", "tiny"])


def test_graphed_on_defaults_to_every_cell_on_a_gpu(monkeypatch):
    monkeypatch.setattr(script, "ON_GPU", True)
    assert script.parse_args(["--shape", "tiny", "--rows", "5"]).graphed_on == ["tiny", "T=5"]
    assert script.parse_args(["--shape", "tiny", "--rows", "5", "--graphed-on", "T=5"]).graphed_on == ["T=5"]
    assert script.parse_args(["--shape", "tiny", "--graphed-on"]).graphed_on == []
    with pytest.raises(SystemExit):
        script.parse_args(["--shape", "tiny", "--graphed-on", "mid"])  # not a cell of this run


# -- the graphed measurement's check, with a stand-in for the graph on the CPU --------------------


def static_outputs(call):
    """What a CUDA graph does to ``call``'s outputs: the same buffers every time, rewritten by each use."""
    kept = []

    def replay():
        outputs = call()
        if not kept:
            kept.append(outputs)
        else:
            for buffer, fresh in zip(kept[0], outputs, strict=True):
                buffer.copy_(fresh)
        return kept[0]

    return replay


def stale_outputs(call):
    """A broken graph: its first outputs, never recomputed."""
    kept = []

    def replay():
        if not kept:
            kept.append(call())
        return kept[0]

    return replay


def inputs(T=37):
    params = torch.randn(T, 10, 3, device=common.DEVICE).requires_grad_()
    return params, torch.randn(T, device=common.DEVICE), torch.ones((), device=common.DEVICE)


@pytest.mark.parametrize("fn", [gmm_nll_eager, gmm_nll], ids=["eager", "fused"])
def test_graphed_check_passes_a_faithful_replay(monkeypatch, fn):
    monkeypatch.setattr(bench, "graph_replay", static_outputs)
    result = bench.check_and_time_graphed(fn, *inputs())
    assert result["err_grad"] < 1e-5 and result["fwd_bwd_ms"] > 0 and result["reps"] >= 1


def test_graphed_check_fails_a_replay_that_ignores_new_inputs(monkeypatch):
    monkeypatch.setattr(bench, "graph_replay", stale_outputs)
    with pytest.raises(AssertionError, match="replayed gradient"):
        bench.check_and_time_graphed(gmm_nll_eager, *inputs())


def test_graphed_copy_is_checked(monkeypatch):
    monkeypatch.setattr(bench, "graph_replay", lambda call: static_outputs(lambda: (call(),)))
    assert bench.time_copy(1000, common.DEVICE, graphed=True)["fwd_bwd_ms"] > 0
    monkeypatch.setattr(bench, "graph_replay", lambda call: stale_outputs(lambda: (call(),)))
    with pytest.raises(AssertionError, match="did not reproduce"):
        bench.time_copy(1000, common.DEVICE, graphed=True)


# -- the report ----------------------------------------------------------------------------------


def rows(run_group: str, utc: str, mode, shape: str, targets: int, ms: dict) -> list[dict]:
    """One run's ok rows of one cell: ``ms`` maps variant to fwd_bwd_ms."""
    out = []
    for variant, fwd_bwd_ms in ms.items():
        row = {
            "gpu": "NVIDIA H100 80GB HBM3",
            "utc": utc,
            "run_group": run_group,
            "variant": variant,
            "shape": shape,
            "dtype": "bfloat16",
            "status": "ok",
            "error": "",
            "targets": targets,
            "fwd_bwd_ms": fwd_bwd_ms,
            "fwd_bwd_gbps": 1.0 / fwd_bwd_ms,
            "mode": mode,
        }
        if variant != "copy" and mode != "graphed":
            row |= {"fwd_ms": fwd_bwd_ms / 4, "bwd_ms": fwd_bwd_ms / 4, "peak_mb": 1.0, "err_out": 0.0}
        if variant != "copy":
            row["err_grad"] = 1.6e-3
        out.append(row)
    return out


AUTOGRAD_MID = {"eager": 0.8, "compile": 0.45, "fused": 0.2, "copy": 0.006}


def section(text: str, start: str, end: str) -> str:
    return text[text.index(start) : text.index(end, text.index(start))]


def test_report_renders_autograd_and_graphed_sections(tmp_path):
    old = rows("run-a", "2026-11-21T20:00:00", float("nan"), "mid", 4000, AUTOGRAD_MID)  # no mode yet
    graphed = rows("run-b", "2026-11-22T02:00:00", "graphed", "mid", 4000, {"eager": 0.1, "fused": 0.015})
    graphed += rows("run-b", "2026-11-22T02:00:00", "graphed", "mid", 4000, {"copy": 0.01})
    big = {"eager": 8.0, "compile": 1.5, "fused": 0.3, "copy": 0.27}
    graphed += rows("run-b", "2026-11-22T02:00:00", "autograd", "T=4194304", 4194304, big)
    graphed += rows("run-b", "2026-11-22T02:00:00", "graphed", "T=4194304", 4194304, big)
    failed = {**graphed[-1], "variant": "compile", "status": "error", "error": "capture failed"}
    graphed[-3] = failed  # graphed compile at 4M failed
    text = report.render(pd.DataFrame(old + graphed), Figures("08_test", tmp_path))

    autograd = section(text, "## Goals (forward+backward)", "## As CUDA-graph replays")
    assert "- mid (T=4000): 3% of the copy's bandwidth" in autograd
    assert "4.0× eager (goal 5×): **missed**" in autograd
    assert "- T=4194304: 90% of the copy's bandwidth" in autograd
    table = section(autograd, "## All cells", "![")
    assert table.count("| mid ") == 4 and table.count("| T=4194304 ") == 4  # no graphed row among them

    replays = text[text.index("## As CUDA-graph replays") :]
    assert "- mid (T=4000): 67% of the graphed copy's bandwidth (goal 80%), 6.7× graphed eager" in replays
    assert "6.7× graphed eager (goal 5×): **missed**" in replays
    assert "- T=4194304: 90% of the graphed copy's bandwidth (goal 80%), 26.7× graphed eager" in replays
    assert "26.7× graphed eager (goal 5×): **met**" in replays
    cells = section(replays, "### All graphed cells", "### Cells that did not finish")
    assert cells.count("| mid ") == 3 and cells.count("| T=4194304 ") == 3
    assert "| 0.6667 " in cells  # fused's share of the graphed copy at mid: the copy's time over fused's
    assert "capture failed" in replays[replays.index("### Cells that did not finish") :]


def test_report_without_a_mode_column_is_the_autograd_report(tmp_path):
    with_mode = pd.DataFrame(rows("run-a", "2026-11-21T20:00:00", "autograd", "mid", 4000, AUTOGRAD_MID))
    without = with_mode.drop(columns="mode")
    text = report.render(without, Figures("08_test", tmp_path))
    assert "As CUDA-graph replays" not in text
    assert "4.0× eager (goal 5×): **missed**" in text
    assert text == report.render(with_mode, Figures("08_test", tmp_path))


# -- a replay's gradient on the GPU --------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 37, 4000])
def test_graphed_fused_gradient_matches_the_plain_call(T):
    params = torch.randn(T, 10, 3, device=common.DEVICE, dtype=torch.bfloat16).requires_grad_()
    y = torch.randn(T, device=common.DEVICE)
    grad_loss = torch.ones((), device=common.DEVICE)
    replay = common.graph_replay(lambda: torch.autograd.grad(gmm_nll(params, y), (params,), grad_loss))
    replay()  # captured here, on the first inputs
    with torch.no_grad():  # fresh values in the captured buffers, and a gradient the replay must overwrite
        params.copy_(torch.randn_like(params))
        y.copy_(torch.randn_like(y))
    (graphed,) = replay()
    graphed.fill_(float("nan"))
    (graphed,) = replay()
    (plain,) = torch.autograd.grad(gmm_nll(params, y), (params,), grad_loss)
    assert torch.equal(graphed, plain)  # the same kernels on the same inputs: the same bits


def test_headline_is_fused_against_eager_and_the_copy(tmp_path):
    graphed = rows("run-b", "2026-11-22T02:00:00", "graphed", "mid", 4000, {"eager": 0.1, "fused": 0.015})
    graphed += rows("run-b", "2026-11-22T02:00:00", "graphed", "mid", 4000, {"copy": 0.01})
    big = {"eager": 8.0, "compile": 1.5, "fused": 0.3, "copy": 0.27}
    graphed += rows("run-b", "2026-11-22T02:00:00", "autograd", "T=4194304", 4194304, big)
    verdicts = {v.cell: v for v in report.headline(pd.DataFrame(graphed))}
    assert verdicts["mid, graphed"].baseline == "eager" and verdicts["mid, graphed"].verdict() == "met"
    assert verdicts["mid, graphed, share of copy"].verdict() == "missed by 17%"  # 67% against 80%
    assert verdicts["T=4194304, autograd"].ratio == pytest.approx(8.0 / 0.3)
    assert verdicts["T=4194304, autograd, share of copy"].verdict() == "met"
