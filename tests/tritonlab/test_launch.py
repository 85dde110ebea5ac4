"""tritonlab._launch: the cache key must change whenever Triton's specialisation could."""

import threading

import torch

import tritonlab._launch as launch_module
from tritonlab._launch import (
    LaunchCache,
    autotune_for_launch,
    constexpr_tail,
    first_launch,
    signature_key,
    tma_ok,
    use_descriptor_scratch,
)
from tritonlab._runtime import kernel_device_type


def test_signature_key_tells_apart_what_specialises_a_kernel():
    flat = torch.zeros(65, dtype=torch.float16)
    base = flat[:64].view(4, 16)
    same = torch.zeros(4, 16, dtype=torch.float16)
    assert signature_key(base) == signature_key(same)  # fresh data, same signature: one launch
    assert signature_key(base) != signature_key(flat[1:].view(4, 16))  # 2 bytes off alignment
    assert signature_key(base) != signature_key(base.t())  # strides
    assert signature_key(base) != signature_key(base.float())  # dtype
    assert signature_key(base) != signature_key(flat[:60].view(4, 15))  # shape


def test_constexpr_tail_follows_the_kernel_parameter_order():
    class Kernel:
        arg_names = ["X", "n", "BLOCK", "EVEN"]

    assert constexpr_tail(Kernel, 2, {"EVEN": True, "BLOCK": 64, "unused": 1}) == (64, True)


def test_autotune_for_launch_keeps_the_chosen_config_grid_and_arguments():
    class Config:
        kwargs = {"BLOCK": 64}

    class Autotuner:  # what it needs of triton.autotune: indexing by a grid, best_config, fn
        best_config = Config()

        class fn:
            arg_names = ["X", "scale", "n", "HEAD_DIM", "BLOCK"]

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
    class Kernel:  # what it needs of a JIT function: indexing by a grid, arg_names
        arg_names = ["X", "n", "HEAD_DIM", "BLOCK"]

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


def test_tma_ok_needs_unit_last_stride_and_16_byte_alignment():
    for shape in [(2, 17, 16), (17, 32), (2, 3, 17, 16)]:  # flash2's, phase 06's and phase 02's ranks
        assert tma_ok(torch.randn(*shape))
    assert not tma_ok(torch.randn(2, 16, 17).transpose(1, 2))  # stride 17 along the last dimension
    assert not tma_ok(torch.randn(2, 17, 17)[..., :16])  # rows of 68 bytes
    assert not tma_ok(torch.randn(2 * 17 * 16 + 1)[1:].view(2, 17, 16))  # start off by 4 bytes
    assert tma_ok(torch.randn(1, 17, 3, 16).unbind(2)[1])  # fused QKV: rows of 192 bytes
    assert not tma_ok(torch.randn(2, 17, 16), torch.randn(2, 17, 17)[..., :16])  # every tensor counts
