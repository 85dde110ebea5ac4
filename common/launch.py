"""Launching a compiled Triton kernel again without re-binding its arguments.

``kernel[grid](*args)`` re-derives on every call how each argument specialises the binary
(dtypes, 16-byte alignment of pointers, integers equal to 1 or divisible by 16) and looks the
binary up: about 22 µs of host time for phase 02's 35-argument kernel on the H200's host,
against 6 µs for the launch itself. Where a whole attention forward + backward takes 0.12 ms of
GPU time, that difference decides the benchmark. A caller that knows what decides the
specialisation -- for kernels whose integer arguments all derive from their tensors' shapes and
strides, ``signature_key`` of those tensors -- compiles once per key and then calls
``launch_compiled``. GPU only: in the interpreter there is no compiled kernel to hold.
"""

import torch
from triton import knobs
from triton.runtime.driver import driver


def signature_key(*tensors: torch.Tensor) -> tuple:
    """Shape, strides, dtype, device and 16-byte alignment of each tensor: all that specialises a
    kernel whose integer arguments are these tensors' sizes and strides (a binary is loaded per
    device, so the device is part of the key too)."""
    return tuple((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0) for t in tensors)


def constexpr_tail(jit_fn, n_args: int, constexprs: dict) -> tuple:
    """The values of the parameters after the first ``n_args``, in the kernel's order."""
    return tuple(constexprs[name] for name in jit_fn.arg_names[n_args:])


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
