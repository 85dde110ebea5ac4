"""tritonlab._runtime: where kernels run, and the preload of Triton's once-per-process start-up."""

import pytest
import torch
import triton

import tritonlab
from tritonlab._runtime import INTERPRET, cdiv, next_power_of_2
from tritonlab.testing import run_without_interpreter

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
    out = run_without_interpreter(_PRELOAD_CHECK)
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
    out = run_without_interpreter(_PRELOAD_FAILURE)
    assert out.stdout.strip() == "ok" and "Traceback" not in out.stderr


_JOIN_CHECK = """
from tritonlab._runtime import join_preload, preload
join_preload()  # nothing started: returns at once and starts nothing
assert preload.cache_info().currsize == 0
thread = preload()
join_preload()
assert not thread.is_alive()
print("ok")
"""


def test_join_preload_waits_for_a_started_preload_and_starts_none():
    out = run_without_interpreter(_JOIN_CHECK)
    assert out.stdout.strip() == "ok"


@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_torch_warm_up_leaves_the_random_generators_alone():
    from tritonlab._runtime import _warm_torch

    cpu, cuda = torch.get_rng_state(), torch.cuda.get_rng_state()
    _warm_torch(torch.cuda.current_device())
    assert torch.equal(torch.get_rng_state(), cpu) and torch.equal(torch.cuda.get_rng_state(), cuda)


@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_capability_is_torchs_for_every_way_of_naming_the_device():
    from tritonlab._runtime import capability

    expected = torch.cuda.get_device_capability()
    index = torch.cuda.current_device()
    assert capability() == capability(index) == capability(torch.device("cuda", index)) == expected


@pytest.mark.parametrize("a", [0, 1, 2, 15, 16, 17, 100, 1023, 1024, 1025, 2**40 + 3])
@pytest.mark.parametrize("b", [1, 3, 16, 64, 128])
def test_cdiv_and_next_power_of_2_match_triton(a, b):
    """The host-side helpers the launch paths use instead of Triton's constexpr functions."""
    assert cdiv(a, b) == triton.cdiv(a, b)
    assert next_power_of_2(a) == triton.next_power_of_2(a)
