"""tritonlab._runtime: where kernels run, and the preload of Triton's once-per-process start-up."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tritonlab
from tritonlab._runtime import INTERPRET

_PRELOAD_CHECK = """
import tritonlab
from triton.runtime.cache import triton_key
assert triton_key.cache_info().currsize == 0
thread = tritonlab.preload()
assert thread is not None and tritonlab.preload() is thread  # once per process
thread.join()
assert triton_key.cache_info().currsize == 1  # computed: the first launch finds it
import sys
assert "triton.experimental.gluon.nvidia.hopper" in sys.modules
print("ok")
"""


def test_preload_computes_tritons_cache_key_and_imports_gluon_in_a_thread():
    # Its own process without the interpreter: a compiling Triton is what preload warms.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", _PRELOAD_CHECK], capture_output=True, text=True, env=env, cwd=root, check=True
    )
    assert out.stdout.strip() == "ok"


@pytest.mark.skipif(not INTERPRET, reason="the CPU suite's interpreter")
def test_preload_does_nothing_in_the_interpreter():
    assert tritonlab.preload() is None


_PRELOAD_FAILURE = """
import threading
import triton.runtime.cache as cache
import tritonlab

def broken():
    raise RuntimeError("moved in this Triton")

cache.triton_key = broken
hooked = []
threading.excepthook = lambda args: hooked.append(args)
tritonlab.preload().join()
assert not hooked, hooked  # nothing escapes the thread
print("ok")
"""


def test_a_preload_that_fails_stays_silent_in_its_thread():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", _PRELOAD_FAILURE],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        check=True,
    )
    assert out.stdout.strip() == "ok" and "Traceback" not in out.stderr
