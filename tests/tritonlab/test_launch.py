"""tritonlab._launch: the cache key must change whenever Triton's specialisation could."""

import inspect
import threading

import pytest
import torch

import tritonlab._launch as launch_module
from tritonlab._launch import (
    LaunchCache,
    autotune_for_launch,
    constexpr_tail,
    first_launch,
    launch,
    signature_key,
    tma_ok,
    use_descriptor_scratch,
)
from tritonlab._runtime import kernel_device_type


def params_of(fn) -> list:
    """A JIT function's ``params`` as the stand-ins below need them: each parameter's name and default."""
    return list(inspect.signature(fn).parameters.values())


def test_signature_key_tells_apart_what_specialises_a_kernel():
    flat = torch.zeros(65, dtype=torch.float16)
    base = flat[:64].view(4, 16)
    same = torch.zeros(4, 16, dtype=torch.float16)
    assert signature_key(base) == signature_key(same)  # fresh data, same signature: one launch
    assert signature_key(base) != signature_key(flat[1:].view(4, 16))  # 2 bytes off alignment
    assert signature_key(base) != signature_key(base.t())  # strides
    assert signature_key(base) != signature_key(base.float())  # dtype
    assert signature_key(base) != signature_key(flat[:60].view(4, 15))  # shape
    assert signature_key(base, None) == signature_key(same, None) != signature_key(base, base)


def test_constexpr_tail_follows_the_kernel_parameter_order():
    class Kernel:
        params = params_of(lambda X, n, BLOCK, EVEN, HAS_W=True: None)

    assert constexpr_tail(Kernel, 2, {"EVEN": True, "BLOCK": 64, "unused": 1}) == (64, True, True)
    assert constexpr_tail(Kernel, 2, {"EVEN": True, "BLOCK": 64, "HAS_W": False}) == (64, True, False)


def test_autotune_for_launch_keeps_the_chosen_config_grid_and_arguments():
    class Config:
        kwargs = {"BLOCK": 64}

    class Autotuner:  # what it needs of triton.autotune: indexing by a grid, best_config, fn
        best_config = Config()

        class fn:
            params = params_of(lambda X, scale, n, HEAD_DIM, BLOCK: None)

        def __getitem__(self, grid):
            def run(*args, **meta):
                self.ran = (grid(self.best_config.kwargs), args, meta)
                return "compiled"

            return run

    tuner = Autotuner()
    x = torch.zeros(3)
    kept = autotune_for_launch((x, 0.5), tuner, lambda c: (1000 // c["BLOCK"], 4), (1000,), {"HEAD_DIM": 16})
    assert tuner.ran == ((15, 4), (x, 0.5, 1000), {"HEAD_DIM": 16})  # the autotuner ran the call
    assert kept == ("compiled", (15, 4, 1), (1000, 16, 64), tuner.best_config)


def test_first_launch_runs_the_kernel_and_keeps_its_3d_grid_and_arguments():
    class Kernel:  # what it needs of a JIT function: indexing by a grid, params
        params = params_of(lambda X, n, HEAD_DIM, BLOCK: None)

        def __getitem__(self, grid):
            def run(*args, **meta):
                self.ran = (grid, args, meta)
                return "compiled"

            return run

    kernel, x = Kernel(), torch.zeros(3)
    constexprs = {"BLOCK": 64, "HEAD_DIM": 16, "num_warps": 8}  # a launch option among them
    kept = first_launch((x,), kernel, (5, 2), (1000,), constexprs)
    assert kernel.ran == ((5, 2), (x, 1000), constexprs)
    assert kept == ("compiled", (5, 2, 1), (1000, 16, 64), None)
    assert first_launch((x,), kernel, (7,), (1,), constexprs)[1] == (7, 1, 1)


def test_descriptor_scratch_is_set_in_the_calling_thread():
    from triton.runtime import _allocation

    seen = {}

    def worker():  # a new thread starts with Triton's default: no allocator
        seen["before"] = _allocation._allocator.get()
        use_descriptor_scratch()
        seen["after"] = _allocation._allocator.get()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen["before"] is not seen["after"]
    buffer = seen["after"](64, 128, None)
    assert buffer.numel() == 64 and buffer.device.type == kernel_device_type()


def test_launch_cache_tunes_once_per_key_and_launches_directly_after(monkeypatch):
    launched, tuned = [], []
    monkeypatch.setattr(launch_module, "launch_compiled", lambda *call: launched.append(call))

    def tune(tensors, extra):  # stands for an autotuner call: it has run the kernel on tensors
        tuned.append((tensors, extra))
        return "binary", (7, 1, 1), (extra, "CONST"), f"config-{extra}"

    cache = LaunchCache(tune)
    assert cache.launch("a", ("x",), 1) == "config-1"
    assert tuned == [(("x",), 1)] and launched == []  # the miss ran the kernel once, through tune
    assert cache.launch("a", ("y",), 2) == "config-1"  # a hit: tune_args unused, no tuning
    assert cache.launch("b", ("z",), 3) == "config-3"
    assert len(tuned) == 2
    assert launched == [("binary", (7, 1, 1), ("y", 1, "CONST"))]
    assert cache.info("a") == "config-1" and cache.info("c") is None  # the pick, without launching
    assert len(launched) == 1 and len(tuned) == 2


def test_tma_ok_needs_unit_last_stride_and_16_byte_alignment():
    for shape in [(2, 17, 16), (17, 32), (2, 3, 17, 16)]:  # flash2's, phase 06's and phase 02's ranks
        assert tma_ok(torch.randn(*shape))
    assert not tma_ok(torch.randn(2, 16, 17).transpose(1, 2))  # stride 17 along the last dimension
    assert not tma_ok(torch.randn(2, 17, 17)[..., :16])  # rows of 68 bytes
    assert not tma_ok(torch.randn(2 * 17 * 16 + 1)[1:].view(2, 17, 16))  # start off by 4 bytes
    assert tma_ok(torch.randn(1, 17, 3, 16).unbind(2)[1])  # fused QKV: rows of 192 bytes
    assert not tma_ok(torch.randn(2, 17, 16), torch.randn(2, 17, 17)[..., :16])  # every tensor counts


class CountingKernel:
    """A JIT function as ``launch`` uses it: ``kernel[grid](...)`` compiles (counted) and runs."""

    params = params_of(lambda X, W, Y, n, eps, BLOCK, HAS_W=True: None)

    def __init__(self, name: str = "kernel"):
        self.name, self.compiles = name, 0

    def __getitem__(self, grid):
        def run(*args, **meta):
            self.compiles += 1
            return f"{self.name}-binary-{self.compiles}"

        return run


def test_launch_compiles_again_whenever_anything_the_kept_launch_holds_changes(monkeypatch):
    launched = []
    monkeypatch.setattr(launch_module, "INTERPRET", False)
    monkeypatch.setattr(launch_module, "launch_compiled", lambda *call: launched.append(call))
    kernel, other_kernel = CountingKernel(), CountingKernel("other")
    cache = LaunchCache(first_launch)
    x, w, y = torch.zeros(4, 16), torch.zeros(16), torch.zeros(4, 16)
    base = {"kernel": kernel, "grid": (4,), "tensors": (x, w, y), "scalars": (4, 1e-6)}
    base["constexprs"] = {"BLOCK": 16, "num_warps": 4}

    def call(**change):
        args = {**base, **change}
        launch(cache, args["kernel"], args["grid"], args["tensors"], args["scalars"], args["constexprs"])

    call()
    assert kernel.compiles == 1 and launched == []
    fresh = (torch.ones(4, 16), torch.ones(16), torch.ones(4, 16))  # other data, same signature
    call(tensors=fresh)
    assert kernel.compiles == 1 and len(launched) == 1
    binary, grid, args = launched[0]
    assert binary == "kernel-binary-1" and grid == (4, 1, 1)
    assert all(a is b for a, b in zip(args[:3], fresh, strict=True))  # this call's tensors
    assert args[3:] == (4, 1e-6, 16, True)  # scalars, BLOCK, HAS_W's default

    wide = torch.zeros(4, 32)
    changes = {
        "eps": {"scalars": (4, 1e-5)},
        "n": {"scalars": (5, 1e-6)},
        "grid": {"grid": (8,)},
        "constexpr": {"constexprs": {"BLOCK": 32, "num_warps": 4}},
        "launch option": {"constexprs": {"BLOCK": 16, "num_warps": 8}},
        "a default overridden": {"constexprs": {"BLOCK": 16, "num_warps": 4, "HAS_W": False}},
        "stride": {"tensors": (wide[:, :16], w, y)},
        "dtype": {"tensors": (x, w.half(), y)},
        "alignment": {"tensors": (x, torch.zeros(17)[1:], y)},
        "shape": {"tensors": (x, w, torch.zeros(5, 16))},
        "no weight": {"tensors": (x, None, y)},
        "kernel": {"kernel": other_kernel},
    }
    binaries = {}
    for what, change in changes.items():
        compiling = change.get("kernel", kernel)
        before = compiling.compiles
        call(**change)
        assert compiling.compiles == before + 1, what  # a new key: compiled, not launched directly
        binaries[what] = f"{compiling.name}-binary-{compiling.compiles}"
    assert len(launched) == 1
    for what, change in changes.items():  # each kept under a key of its own
        call(**change)
        assert launched[-1][0] == binaries[what], what
    assert len(launched) == 1 + len(changes)
    assert launched[-2][2][1] is None  # "no weight": None in W's place (Triton's constexpr None)


def test_launch_key_tensors_narrow_only_the_signatures(monkeypatch):
    launched = []
    monkeypatch.setattr(launch_module, "INTERPRET", False)
    monkeypatch.setattr(launch_module, "launch_compiled", lambda *call: launched.append(call))
    kernel, cache = CountingKernel(), LaunchCache(first_launch)
    x, w = torch.zeros(4, 16), torch.zeros(16)
    for y, eps in ((torch.zeros(4, 16), 1e-6), (torch.zeros(4, 16).half(), 1e-6), (torch.zeros(4, 16), 1e-5)):
        launch(cache, kernel, (4,), (x, w, y), (4, eps), {"BLOCK": 16}, key_tensors=(x, w))
    # y's dtype is left to the caller (its layout follows from x's); a scalar still counts
    assert kernel.compiles == 2 and len(launched) == 1


@pytest.mark.parametrize("interpret", [True, False])
def test_launch_refuses_a_tensor_where_a_kept_launch_would_replay_it(monkeypatch, interpret):
    monkeypatch.setattr(launch_module, "INTERPRET", interpret)
    kernel, x = CountingKernel(), torch.zeros(4)
    with pytest.raises(TypeError, match="pass tensors among"):
        launch(LaunchCache(first_launch), kernel, (1,), (x, None, x), (4, 1e-6), {"BLOCK": 16, "HAS_W": x})
    with pytest.raises(TypeError, match="pass tensors among"):
        launch(LaunchCache(first_launch), kernel, (1,), (x, None), (x, 4, 1e-6), {"BLOCK": 16})
    assert kernel.compiles == 0
