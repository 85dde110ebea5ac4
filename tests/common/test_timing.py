"""Timing on the CPU: medians and quantiles are ordered, stages are all recorded."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from common import StageTimer, bench
from common.timing import bench_interleaved, cprofile_calls, summarize, top_functions


def test_summarize_orders_quantiles():
    t = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert t.ms == 3.0 and t.p20_ms <= t.ms <= t.p80_ms and t.reps == 5


def test_bench_measures_a_sleep():
    t = bench(lambda: time.sleep(0.002), warmup_ms=5, rep_ms=30)
    assert 1.5 < t.ms < 50 and t.reps >= 3


def test_bench_interleaved_alternates_rounds_and_pools_samples():
    """Rounds run A B, B A, A B; each call's rounds are summarised together, each call timed alone."""
    order = []

    def call(name, seconds):
        def run():
            order.append(name)
            time.sleep(seconds)

        return run

    timings = bench_interleaved(
        {"a": call("a", 0.001), "b": call("b", 0.004)}, rounds=3, warmup_ms=0, rep_ms=10, min_reps=3
    )
    runs = [name for i, name in enumerate(order) if i == 0 or order[i - 1] != name]
    assert runs == ["a", "b", "a", "b"]  # a b | b a | a b: the middle b's and a's meet
    assert timings["a"].reps >= 9 and timings["b"].reps >= 9
    assert 0.5 < timings["a"].ms < timings["b"].ms < 50


def test_stage_timer_records_every_stage():
    timer = StageTimer()
    for _ in range(3):
        with timer.stage("step"):
            with timer.stage("forward"):
                time.sleep(0.001)
            with timer.stage("backward"):
                time.sleep(0.002)
    stages = timer.summary()
    assert set(stages) == {"step", "forward", "backward"}
    assert stages["step"].reps == 3
    assert stages["step"].ms >= stages["forward"].ms + stages["backward"].ms * 0.9


def test_summarize_one_sample():
    t = summarize([2.5])
    assert (t.ms, t.p20_ms, t.p80_ms, t.reps) == (2.5, 2.5, 2.5, 1)


@pytest.mark.gpu
def test_head_start_keeps_a_host_stall_out_of_the_gpu_time():
    # Each call stalls the host 2 ms before a ~0.1 ms product: without a head start the GPU waits
    # inside the timed interval, with one it finds the product already queued.
    x = torch.randn(2048, 2048, device="cuda")

    def call():
        time.sleep(0.002)
        return x @ x

    plain = bench(call, warmup_ms=5, rep_ms=60, flush_l2=False)
    ahead = bench(call, warmup_ms=5, rep_ms=60, flush_l2=False, head_start_ms=5.0)
    assert plain.ms > 1.5
    assert ahead.ms < 0.5 * plain.ms


_COMPILE_TWICE = r"""
import json, sys
import triton
import triton.language as tl
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from common.timing import triton_compiles

@triton.jit
def store_range(X, N: tl.constexpr):
    tl.store(X + tl.arange(0, N), tl.arange(0, N))

source = ASTSource(store_range, signature={"X": "*fp32", "N": "constexpr"}, constexprs={"N": 16})
heard = []
knobs.compilation.listener = lambda **kw: heard.append(kw["cache_hit"])
with triton_compiles() as tally:
    triton.compile(source, target=GPUTarget("cuda", 90, 32))
    triton.compile(source, target=GPUTarget("cuda", 90, 32))
print(json.dumps({"compiled": tally.compiled, "loaded": tally.loaded, "compile_s": tally.compile_s,
                  "heard": heard, "restored": knobs.compilation.listener.__name__}))
"""


def test_triton_compiles_counts_compilations_and_cache_loads(tmp_path):
    # In a fresh process without the interpreter (whose patching of triton.language would leak into
    # a compile here); compiling for sm_90 needs no GPU, and the second compile loads from the cache.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    script = tmp_path / "compile_twice.py"  # Triton reads a kernel's source from its file
    script.write_text(_COMPILE_TWICE)
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert (got["compiled"], got["loaded"]) == (1, 1) and got["compile_s"] > 0
    # The listener set before still hears every compile, and is set again afterwards.
    assert got["heard"] == [False, True] and got["restored"] == "<lambda>"


_BUILD_MODULE = r"""
import json
from triton.runtime import build
from common.timing import triton_compiles

src = ("#include <Python.h>\n"
       'static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "tiny", NULL, -1, NULL};\n'
       "PyMODINIT_FUNC PyInit_tiny(void) { return PyModule_Create(&m); }\n")
default = build._build
with triton_compiles() as tally:
    build.compile_module_from_src(src, "tiny")  # an empty cache: built
    build.compile_module_from_src(src, "tiny")  # from the cache
print(json.dumps({"built": tally.launchers_built, "seconds": tally.launcher_s,
                  "restored": build._build is default}))
"""


def test_triton_compiles_times_the_c_launchers_it_builds(tmp_path):
    # Triton's launchers are C modules it compiles per kernel signature (compile_module_from_src);
    # a tiny module stands in for one: built once, then loaded from the cache.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    out = subprocess.run([sys.executable, "-c", _BUILD_MODULE], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["built"] == 1 and got["seconds"] > 0 and got["restored"]


def _host_work():
    return sum(i * i for i in range(200))


def test_cprofile_calls_counts_every_call_and_top_functions_drops_blank_lines():
    stats = cprofile_calls(_host_work, 7)
    counts = {func[2]: calls for func, (calls, *_rest) in stats.stats.items()}
    assert counts["_host_work"] == 7
    table = top_functions(stats, "tottime", 5)
    assert (
        "_host_work" in table
        and "ncalls" in table
        and "" not in [line.strip() for line in table.splitlines()]
    )
