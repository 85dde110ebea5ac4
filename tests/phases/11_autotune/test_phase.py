"""Phase 11's command line, table building (the H100's from tunings, the A100's from the sm_80 compile
check), the committed sm_80 results, and the report's verdicts from GPU-like rows."""

import json
import types

import pandas as pd
import pytest
import triton

from common.report import Figures
from phases.__main__ import phase_module
from tritonlab import tuning_tables as tt
from tritonlab.testing import run_without_interpreter

GPU = "NVIDIA H100 80GB HBM3"
FAST, SLOW, OTHER = (triton.Config({"BLOCK": b}, num_warps=4) for b in (64, 128, 32))
PROVENANCE = {
    "gpu": GPU,
    "triton": "3.6.0",
    "torch": "2.11.0",
    "cuda": "13.0",
    "git_commit": "abc",
    "utc": "now",
}


@pytest.mark.parametrize("argv", [["--repeats", "0"], ["--functions", "nope"], ["--tasks", "nope"]])
def test_cli_rejects_bad_input(argv, capsys):
    main = phase_module("11", "__main__")
    with pytest.raises(SystemExit) as err:
        main.parse_args(argv)
    assert err.value.code == 2 and "error:" in capsys.readouterr().err


def _tuning(key, pick=FAST, kernel="toy.k"):
    timings = {tt.config_id(FAST): 1.0, tt.config_id(SLOW): 1.5, tt.config_id(OTHER): float("inf")}
    return tt.Tuning(kernel, key, "h100", "bf16", pick, timings, 2.0)


def test_tunings_become_entries_merged_into_the_table_there(tmp_path):
    tables = phase_module("11", "tables")
    old = tt.ConfigTable("h100", "bf16", path=tt.table_path("h100", "bf16", tmp_path))
    old.put("toy.other", "K", {"config": tt.config_to_json(SLOW), "status": tt.TIMED})
    old.save()
    (table,) = tables.tables_from_tunings(
        [_tuning("N=64")], PROVENANCE, tmp_path, {("toy.k", "N=64"): "toy@small"}
    )
    entry = table.entry("toy.k", "N=64")
    assert entry["status"] == tt.TIMED and (entry["ms"], entry["runner_up_ms"]) == (1.0, 1.5)
    assert entry["workload"] == "toy@small" and entry["git_commit"] == "abc" and entry["triton"] == "3.6.0"
    assert tt.config_id(entry["config"]) == tt.config_id(FAST)
    assert entry["candidates_ms"][tt.config_id(OTHER)] is None  # failed (inf): null in the file
    assert table.entry("toy.other", "K") is not None  # kept
    loaded = tt.ConfigTable.load(table.save())
    assert loaded.meta["device_name"] == GPU and loaded.entry("toy.k", "N=64") == json.loads(
        json.dumps(entry)
    )


class _Kernel:
    configs = (FAST, SLOW, OTHER)

    def config_named(self, identity):
        return {tt.config_id(c): c for c in self.configs}.get(identity)


def _sm80(usable: dict) -> dict:
    rows = [
        {"kernel": "toy.k", "key": key, "config": tt.config_id(c), "usable": ok, "registers": 100,
         "spill_stores": 0 if ok else 8, "spill_loads": 0 if ok else 8, "shared_bytes": 1024, "error": ""}
        for key, per_config in usable.items() for c, ok in per_config
    ]  # fmt: skip
    return {"target": "sm_80", "rows": rows}


def test_the_a100_table_takes_the_fastest_usable_config_and_says_it_is_not_timed(tmp_path):
    tables = phase_module("11", "tables")
    (h100,) = tables.tables_from_tunings(
        [_tuning("A"), _tuning("B"), _tuning("C"), _tuning("D")], PROVENANCE, tmp_path
    )
    sm80 = _sm80({
        "A": [(FAST, False), (SLOW, True), (OTHER, True)],  # the H100's pick spills: the runner-up
        "B": [(FAST, True), (SLOW, True)],  # the H100's pick
        "C": [(FAST, False), (SLOW, False), (OTHER, True)],  # only an untimed (failed) one is usable
        "D": [(FAST, False), (SLOW, False), (OTHER, False)],  # none: no entry, the A100 tunes
    })  # fmt: skip
    a100 = tables.a100_table(h100, sm80, {"toy.k": _Kernel()}, "bf16")
    picks = {key: tt.config_id(e["config"]) for key, e in a100.entries["toy.k"].items()}
    assert picks == {"A": tt.config_id(SLOW), "B": tt.config_id(FAST), "C": tt.config_id(OTHER)}
    assert all(
        e["status"] == tt.COMPILED_NOT_TIMED and e["ms"] is None for e in a100.entries["toy.k"].values()
    )
    assert (
        a100.entries["toy.k"]["A"]["h100_ms"] == 1.5
        and a100.entries["toy.k"]["A"]["sm80"]["spill_stores"] == 0
    )
    assert a100.gpu == "a100"


# The GPU's search spaces, as a process without the interpreter registers them (the interpreter's
# kernels have one small config each).
_SPACES = """
import json
from tritonlab import tuning_tables as tt, tuning_workloads as tw
tw.import_kernels()
tuned = {k for w in tw.workloads() for k in w.kernels}
print(json.dumps({n: [[tt.config_id(c), k.spec.runs_on_sm80(c)] for c in k.configs]
                  for n, k in tt.TUNER.kernels.items() if n in tuned}))
"""


def test_the_committed_sm80_results_cover_every_runnable_config_and_no_other():
    tables = phase_module("11", "tables")
    results = json.loads(tables.SM80_RESULTS.read_text())
    assert results["target"] == "sm_80" and results["shared_limit_bytes"] == 163 * 1024
    out = run_without_interpreter(_SPACES)
    spaces = json.loads(out.stdout.strip().splitlines()[-1])
    seen = {(r["kernel"], r["config"]) for r in results["rows"]}
    for name, configs in spaces.items():
        runnable = {cid for cid, on_sm80 in configs if on_sm80}
        assert {c for k, c in seen if k == name} == runnable, (
            f"{name}: compiled configs differ from its space"
        )
    for row in results["rows"]:
        usable = not row["error"] and row["spill_stores"] == 0 and row["spill_loads"] == 0
        assert row["usable"] == (usable and row["shared_bytes"] <= results["shared_limit_bytes"])


def _rows():
    base = {"gpu": GPU, "status": "ok", "dtype": "bf16", "utc": "2026-11-25T00:00:00Z", "run_group": "g"}
    return pd.DataFrame([
        {**base, "variant": "compare", "shape": "mid", "function": "attention", "ms_table": 1.01, "ms_full": 1.0,
         "ms_full_min": 0.99, "ms_full_max": 1.02, "ms_off": 1.3, "table_vs_full": 1.01, "off_vs_full": 1.3,
         "first_s_table": 0.5, "first_s_full": 9.0, "repeats": 5, "distinct_full_picks": 2,
         "picks_table": "a: x", "picks_full": "a: x | a: y"},
        {**base, "variant": "kernel", "shape": "mid", "function": "attention", "kernel": "attention.dq", "key": "K",
         "table_vs_best": 1.004, "off_vs_best": 1.2, "best_ms": 0.5, "distinct_picks": 2, "pick_table": "x",
         "picks_full": "x | y"},
        {**base, "variant": "kernel", "shape": "mid", "function": "attention", "kernel": "attention.dkdv", "key": "K",
         "table_vs_best": 1.012, "off_vs_best": 1.3, "best_ms": 0.9, "distinct_picks": 1, "pick_table": "z",
         "picks_full": "z"},
        {**base, "variant": "startup", "shape": "mid", "function": "TransformerNP", "first_step_s_table": 0.3,
         "first_step_s_full": 60.0, "steady_ms": 100.0, "steady_ms_full": 100.0, "first_vs_steady_table": 3.0,
         "first_vs_steady_full": 600.0},
    ])  # fmt: skip


def test_the_report_gives_a_verdict_per_compare_and_startup_cell(tmp_path):
    report = phase_module("11", "report")
    verdicts = {v.cell: v for v in report.headline(_rows())}
    # The picks' verdict: the worst kernel's ratio inside the fresh tunes, side by side.
    table = verdicts[
        "attention @ mid: table pick vs each fresh tune's best, side by side (worst kernel: attention.dkdv)"
    ]
    assert table.ratio == pytest.approx(1 / 1.012) and table.verdict() == "met"
    startup = next(v for cell, v in verdicts.items() if cell.startswith("TransformerNP @ mid"))
    assert startup.ratio == pytest.approx(1 / 3) and startup.verdict().startswith("missed")
    text = report.render(_rows(), Figures("11_autotune", tmp_path, GPU))
    assert "table_vs_full" in text and "first_vs_steady_table" in text and "sm_80" in text
    assert "table_vs_best" in text and "attention.dq" in text


def test_a_split_startup_row_gets_a_verdict_with_and_without_compiled_kernels(tmp_path):
    report = phase_module("11", "report")
    rows = _rows()
    split = {**rows.iloc[-1].to_dict(), "first_step_s_table": float("nan"), "first_vs_steady_table": float("nan"),
             "first_step_s_table_cold": 10.0, "first_step_s_table_warm": 0.15, "first_vs_steady_table_cold": 100.0,
             "first_vs_steady_table_warm": 1.5, "utc": "2026-11-26T00:00:00Z", "run_group": "h"}  # fmt: skip
    rows = pd.concat([rows, pd.DataFrame([split])], ignore_index=True)
    verdicts = {v.cell: v for v in report.headline(rows)}
    warm = verdicts[
        "TransformerNP @ mid: first step with the table (compiled kernels on disk), in steady steps (inverse)"
    ]
    cold = verdicts[
        "TransformerNP @ mid: first step with the table (compiling every kernel), in steady steps (inverse)"
    ]
    assert warm.ratio == pytest.approx(100.0 / 150.0) and warm.verdict() == "met"
    assert cold.ratio == pytest.approx(0.01) and cold.verdict().startswith("missed")
    assert not any("as found" in cell for cell in verdicts)  # the newer row replaces the old one
    text = report.render(rows, Figures("11_autotune", tmp_path, GPU))
    assert "first_step_s_table_cold" in text and "first_step_s_table_warm" in text
    rows.loc[rows.index[-1], "first_step_profile_table_warm"] = "jit.py:600(run) 0.900s (40 calls)"
    text = report.render(rows, Figures("11_autotune", tmp_path, GPU))
    assert (
        "Where a restart's first step goes at mid" in text and "- `jit.py:600(run) 0.900s (40 calls)`" in text
    )


def test_the_startup_cell_compiles_once_then_restarts_on_that_cache(monkeypatch, tmp_path):
    bench = phase_module("11", "bench")
    calls = []

    def probe(mode, what, table_dir, timeout=900, cache_dir=None):
        calls.append((mode, cache_dir, "--profile" in what, "--sdpa" in what))
        if "--profile" in what:
            return {
                "first_step_profile": [["jit.py:600(run)", 0.9, 0.01, 40], ["x.py:1(f)", 0.2, 0.2, 1]],
                "first_step_profile_own": [["cache.py:271(triton_key)", 0.5, 0.4, 1]],
            }
        first = {0: 12.0, 1: 0.2, 3: 40.0, 4: 0.5}[len(calls) - 1]
        compiled = {0: 9, 1: 0, 3: 30, 4: 0}[len(calls) - 1]
        return {"first_step_s": first, "steady_ms": 100.0, "picks": {"k": "c"}, "first_step_compile_s": compiled / 1.5,
                "first_step_kernels_compiled": compiled, "first_step_kernels_loaded": 9 - min(compiled, 9)}  # fmt: skip

    monkeypatch.setattr(bench, "_probe", probe)
    row = bench.startup_cell("mid", tmp_path).run()
    modes, caches, profiled, sdpa = zip(*calls, strict=True)
    assert modes == ("table", "table", "table", "full", "table")
    assert profiled == (False, False, True, False, False) and sdpa == (False, False, False, False, True)
    # restarts (and the baseline) reuse the first's cache; the full tune has its own
    assert caches[0] == caches[1] == caches[2] == caches[4] and caches[3] != caches[0]
    assert caches[0] is not None and caches[3] is not None
    assert row["first_step_s_table_cold"] == 12.0 and row["first_step_s_table_warm"] == 0.2
    assert row["first_vs_steady_table_warm"] == pytest.approx(2.0) and row["first_vs_steady_full"] == 400.0
    assert row["compile_s_table_cold"] == 6.0 and row["kernels_loaded_table_warm"] == 9
    assert row["compile_s_full"] == 20.0 and row["kernels_compiled_table_warm"] == 0
    assert row["first_step_s_sdpa"] == 0.5 and row["first_vs_steady_sdpa"] == pytest.approx(5.0)
    assert (
        row["first_step_profile_table_warm"]
        == "jit.py:600(run) 0.900s (40 calls); x.py:1(f) 0.200s (1 calls)"
    )
    assert row["first_step_profile_own_table_warm"] == "cache.py:271(triton_key) 0.400s (1 calls)"


def test_a_probe_gets_the_compile_cache_it_is_given(monkeypatch, tmp_path):
    bench = phase_module("11", "bench")
    envs = []

    def run(cmd, env, **kw):
        envs.append(env)
        return types.SimpleNamespace(returncode=0, stdout='{"first_step_s": 1.0}\n', stderr="")

    monkeypatch.setattr(bench.subprocess, "run", run)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/callers/cache")
    bench._probe("table", ["--model", "mid"], tmp_path, cache_dir=tmp_path / "c")
    bench._probe("table", ["--model", "mid"], tmp_path)
    assert (
        envs[0]["TRITON_CACHE_DIR"] == str(tmp_path / "c") and envs[1]["TRITON_CACHE_DIR"] == "/callers/cache"
    )
    assert "TRITON_INTERPRET" not in envs[0] and envs[0]["TRITONLAB_AUTOTUNE"] == "table"


def test_kernel_cells_judge_the_table_pick_inside_each_fresh_tune():
    bench = phase_module("11", "bench")
    (workload,) = __import__("tritonlab.tuning_workloads", fromlist=["x"]).workloads(
        ["small"], functions=["attention"]
    )
    tune = {"kernel": "attention.dq", "key": "K", "pick": "a", "timings": {"a": 1.0, "b": 1.01, "c": 2.0}}
    probes = {
        "table": {"picks": {"attention.dq": "b"}},
        "off": {"picks": {"attention.dq": "c"}},
        "full": [
            {"tunings": [tune]},
            {"tunings": [{**tune, "pick": "b", "timings": {"a": 1.0, "b": 0.99, "c": 2.0}}]},
        ],
    }
    row = bench.kernel_cell(workload, "attention.dq", probes).run()
    # Medians over the two tunes (the upper of two): b at 1.01 and 1.0 of the best, c at 2.0 and 2.02.
    assert row["table_vs_best"] == pytest.approx(1.01) and row["off_vs_best"] == pytest.approx(2.0 / 0.99)
    assert row["distinct_picks"] == 2 and row["picks_full"] == "a | b" and row["key"] == "K"
    with pytest.raises(RuntimeError, match="compare cell did not run"):
        bench.kernel_cell(workload, "attention.dq", {}).run()


def test_write_tables_writes_the_h100_table_and_the_a100_one_beside_it(tmp_path, monkeypatch):
    bench = phase_module("11", "bench")
    monkeypatch.setitem(tt.TUNER.kernels, "toy.k", _Kernel())
    sm80 = tmp_path / "sm80.json"
    sm80.write_text(json.dumps(_sm80({"A": [(FAST, False), (SLOW, True)]})))
    written = bench.write_tables([(_tuning("A"), "toy@small")], tmp_path, sm80)
    assert [p.name for p in written] == ["h100_bf16.json", "a100_bf16.json"]
    h100, a100 = (tt.ConfigTable.load(p) for p in written)
    assert h100.entry("toy.k", "A")["workload"] == "toy@small"
    assert tt.config_id(a100.entry("toy.k", "A")["config"]) == tt.config_id(SLOW)


def test_the_profiled_first_call_lists_the_top_functions_by_cumulative_and_own_time(monkeypatch):
    probe = phase_module("11", "probe")
    monkeypatch.setattr(probe.torch.cuda, "synchronize", lambda: None)

    def inner():
        return sum(i * i for i in range(20_000))

    def outer():
        return inner() + inner()

    where = probe.profiled(outer, top=5)
    top, own = where["cumulative"], where["own"]
    assert len(top) <= 5 and all(len(entry) == 4 for entry in top)
    cumulative = [entry[1] for entry in top]
    assert cumulative == sorted(cumulative, reverse=True)
    assert any("(inner)" in entry[0] and entry[3] == 2 for entry in top)
    assert [entry[2] for entry in own] == sorted((entry[2] for entry in own), reverse=True)
    assert any("(<genexpr>)" in entry[0] or "(inner)" in entry[0] for entry in own)
