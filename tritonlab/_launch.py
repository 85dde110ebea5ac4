"""Launching a compiled Triton kernel again without re-binding its arguments.

``kernel[grid](*args)`` re-derives on every call how each argument specialises the binary
(dtypes, 16-byte alignment of pointers, integers equal to 1 or divisible by 16) and looks the
binary up: about 22 µs of host time for phase 02's 35-argument kernel on the H200's host,
against 6 µs for the launch itself. Where a whole attention forward + backward takes 0.12 ms of
GPU time, that difference decides the benchmark. A caller that knows what decides the
specialisation -- for kernels whose integer arguments all derive from their tensors' shapes and
strides, ``signature_key`` of those tensors -- compiles once per key and then calls
``launch_compiled``. GPU only: in the interpreter there is no compiled kernel to hold.
``launch`` does all of it for a plain ``kernel[grid](*tensors, *scalars, **constexprs)`` call.

Kernels that build tensor descriptors (TMA) on the device also need scratch memory from an
allocator: ``use_descriptor_scratch`` before launching them.
"""

import torch
import triton
from triton import knobs
from triton.runtime.driver import driver

from ._runtime import INTERPRET
from .tuning_tables import TUNER, Tuner


def _descriptor_scratch(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cpu" if INTERPRET else "cuda")


def use_descriptor_scratch() -> None:
    """Give Triton the scratch for tensor descriptors built on the device, in the calling thread.

    Triton keeps its allocator in a context variable, so one set when a module is imported is
    missing in every other thread -- and autograd runs backward passes (a checkpoint's recomputed
    forward included) in threads of its own.
    """
    triton.set_allocator(_descriptor_scratch)


def tma_ok(*tensors: torch.Tensor) -> bool:
    """Whether a tensor descriptor can address every tensor: unit stride along the last dimension,
    a 16-byte aligned start and 16-byte multiples for every other stride."""
    return all(
        t.stride(-1) == 1
        and t.data_ptr() % 16 == 0
        and all(stride * t.element_size() % 16 == 0 for stride in t.stride()[:-1])
        for t in tensors
    )


def signature_key(*tensors: torch.Tensor | None) -> tuple:
    """Shape, strides, dtype, device and 16-byte alignment of each tensor: all that specialises a
    kernel whose integer arguments are these tensors' sizes and strides (a binary is loaded per
    device, so the device is part of the key too). None (an optional pointer left out, which Triton
    makes a constexpr) stays None."""
    return tuple(
        None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0)
        for t in tensors
    )


def constexpr_tail(jit_fn, n_args: int, constexprs: dict) -> tuple:
    """The values of the parameters after the first ``n_args``, in the kernel's order: the caller's,
    else the parameter's default, as Triton bound it."""
    return tuple(constexprs.get(p.name, p.default) for p in jit_fn.params[n_args:])


def launch_compiled(kernel, grid: tuple[int, int, int], args: tuple) -> None:
    """Run ``kernel`` -- the CompiledKernel that ``jit_fn[grid](...)`` returned -- on ``grid``.

    ``args`` are all the kernel's parameters in order, constexprs included (the launcher skips
    them), for arguments that specialise exactly as those it was compiled for. Launch hooks (a
    profiler's) still run.
    """
    stream = driver.active.get_current_stream(driver.active.get_current_device())
    enter_hook = knobs.runtime.launch_enter_hook
    metadata = kernel.launch_metadata(grid, stream, *args) if enter_hook is not None else None
    kernel.run(*grid, stream, kernel.function, kernel.packed_metadata, metadata, enter_hook,
               knobs.runtime.launch_exit_hook, *args)  # fmt: skip


def _check_kept(scalars: tuple, constexprs: dict) -> None:
    """Refuse a tensor among what a kept launch replays: the first call's would be read and written
    by every later call."""
    for value in (*scalars, *constexprs.values()):
        if isinstance(value, torch.Tensor):
            raise TypeError(
                "a direct launch replays its scalars and constexprs: pass tensors among `tensors`"
            )


def first_launch(tensors: tuple, kernel, grid: tuple, scalars: tuple, constexprs: dict) -> tuple:
    """``kernel[grid](*tensors, *scalars, **constexprs)`` through Triton's launcher -- the first call
    of a signature, which compiles -- and what ``LaunchCache`` keeps for the direct launches after
    it. ``constexprs`` may hold launch options (``num_warps``) beside the kernel's constexprs, and
    neither it nor ``scalars`` a tensor."""
    _check_kept(scalars, constexprs)
    compiled = kernel[grid](*tensors, *scalars, **constexprs)
    tail = scalars + constexpr_tail(kernel, len(tensors) + len(scalars), constexprs)
    return compiled, (*grid, 1, 1)[:3], tail, None


def autotune_for_launch(tensors: tuple, autotuner, grid, shape_args: tuple, meta: dict) -> tuple:
    """Run ``autotuner`` (a ``triton.autotune`` kernel) on ``tensors + shape_args`` and return what
    ``LaunchCache`` keeps for later direct launches: the compiled kernel of the chosen config, its
    3-D grid, every argument after ``tensors`` (constexprs included) and the config.

    ``grid`` maps a config's keyword arguments to the launch grid, as for the autotuner itself.
    """
    compiled = autotuner[grid](*tensors, *shape_args, **meta)
    config = autotuner.best_config
    n_args = len(tensors) + len(shape_args)
    tail = shape_args + constexpr_tail(autotuner.fn, n_args, {**meta, **config.kwargs})
    return compiled, (*grid(config.kwargs), 1, 1)[:3], tail, config


class LaunchCache:
    """Direct launches per call signature: ``tune`` runs once per key, later calls launch its pick.

    ``tune(tensors, *tune_args)`` runs the kernel on ``tensors`` -- as ``kernel[grid](...)`` and an
    autotuner's call both do, the autotuner after timing its candidates -- and returns
    ``(kernel, grid, other_args, info)``: the compiled kernel, its 3-D grid, every argument after
    ``tensors`` (fixed by the signature, constexprs included) and whatever the caller wants back
    from each launch (the config, the compiler's report).
    """

    def __init__(self, tune, tuner: Tuner | None = None):
        self._tune = tune
        self._launches: dict = {}
        # Its launches hold tuned picks: the tuning state forgets them with its own (Tuner.forget).
        (tuner or TUNER).launch_caches.append(self)

    def clear(self) -> None:
        self._launches.clear()

    def info(self, key):
        """What the kept launch of ``key`` returns from each launch (``info``), None before its first
        -- for callers whose arguments depend on the pick (a tensor descriptor's block shape)."""
        launch = self._launches.get(key)
        return None if launch is None else launch[3]

    def launch(self, key, tensors: tuple, *tune_args):
        launch = self._launches.get(key)
        if launch is None:  # tune has just run the kernel on these tensors
            launch = self._launches[key] = self._tune(tensors, *tune_args)
        else:
            kernel, grid, other_args, _ = launch
            launch_compiled(kernel, grid, tensors + other_args)
        return launch[3]


def launch(
    cache: LaunchCache,
    kernel,
    grid: tuple,
    tensors: tuple,
    scalars: tuple,
    constexprs: dict,
    key_tensors=None,
) -> None:
    """``kernel[grid](*tensors, *scalars, **constexprs)``: through Triton's launcher in the interpreter,
    on the GPU compiled once per key in ``cache`` (a ``LaunchCache(first_launch)``) and then launched
    directly.

    ``tensors`` (None for an optional pointer left out) come first in the kernel's parameters, then
    ``scalars``; ``constexprs`` holds the rest by name, launch options (``num_warps``) included, and
    no tensor: what ``first_launch`` keeps of them is replayed unchanged. The key is everything the
    kept launch depends on: the kernel, the grid, every scalar and constexpr by value, and the
    signature of ``key_tensors`` (default ``tensors``; a caller narrows it only to tensors whose
    layouts fix the others'). Scalars are keyed by value (``1 == 1.0``): a call site passes each in
    one type (``float(eps)``), so that one key never stands for two specialisations.
    """
    if INTERPRET:
        _check_kept(scalars, constexprs)  # what the GPU's first launch refuses, refused in tests too
        kernel[grid](*tensors, *scalars, **constexprs)
        return
    signature = signature_key(*(tensors if key_tensors is None else key_tensors))
    key = (kernel, grid, signature, scalars, tuple(constexprs.items()))
    cache.launch(key, tensors, kernel, grid, scalars, constexprs)
