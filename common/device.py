"""The device a run measures on, and the switch to Triton's interpreter on machines without a GPU.

Triton reads ``TRITON_INTERPRET`` when a kernel is decorated, so the interpreter must be chosen
before any module that defines a ``@triton.jit`` function is imported. Importing this module changes
nothing: the entry points (``python -m phases``, the tests' conftest) call
:func:`use_interpreter_without_gpu` first.
"""

import contextlib
import os
import sys

import torch

ON_GPU: bool = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
CPU_LABEL = "cpu (TRITON_INTERPRET=1)"


def use_interpreter_without_gpu() -> bool:
    """On a machine without a CUDA GPU, set ``TRITON_INTERPRET=1`` (kernels then run on CPU tensors).
    Returns whether the interpreter is on. Call it before importing ``tritonlab``."""
    if ON_GPU:
        return os.environ.get("TRITON_INTERPRET") == "1"
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        print(
            "warning: triton was imported before the interpreter was chosen; kernels may not run",
            file=sys.stderr,
        )
    os.environ["TRITON_INTERPRET"] = "1"
    return True


def synchronize() -> None:
    """Wait for the GPU's queued work (a no-op on the CPU): host-clock timings of whole steps."""
    if ON_GPU:
        torch.cuda.synchronize()


def autocast(dtype: torch.dtype | None):
    """``torch.autocast`` to ``dtype`` on this run's device; None (float32 as it is): no autocast."""
    return contextlib.nullcontext() if dtype is None else torch.autocast(DEVICE.type, dtype=dtype)


def describe_device() -> dict:
    """GPU name and multiprocessor count (or the CPU, when there is no GPU)."""
    if ON_GPU:
        props = torch.cuda.get_device_properties(0)
        return {"gpu": props.name, "sm_count": props.multi_processor_count}
    return {"gpu": CPU_LABEL, "sm_count": 0}


def interpreter_banner() -> str:
    """The line a phase prints so nobody mistakes a CPU smoke run for a measurement."""
    if ON_GPU:
        info = describe_device()
        return f"device: {info['gpu']} ({info['sm_count']} SMs)"
    return (
        "device: no CUDA GPU found -- running on the CPU with TRITON_INTERPRET=1 and a tiny shape; "
        "the timings below check that the code runs, they are not measurements"
    )
