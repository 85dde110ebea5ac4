"""Pick the device, and fall back to Triton's interpreter on machines without a GPU.

Triton reads ``TRITON_INTERPRET`` when a kernel is decorated, so the variable must be set
before any module that defines a ``@triton.jit`` function is imported. Every phase imports
``common`` before its kernels, which makes this module the one place that decides.
"""

import functools
import os
import sys

import torch

ON_GPU: bool = torch.cuda.is_available()

if not ON_GPU:
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        # Kernels defined before this point would be compiled for a GPU that is not there.
        print(
            "warning: triton was imported before common; its kernels may not run on the CPU", file=sys.stderr
        )
    os.environ["TRITON_INTERPRET"] = "1"

DEVICE = torch.device("cuda" if ON_GPU else "cpu")


def describe_device() -> dict:
    """GPU name and multiprocessor count (or the CPU, when there is no GPU)."""
    if ON_GPU:
        props = torch.cuda.get_device_properties(0)
        return {"gpu": props.name, "sm_count": props.multi_processor_count}
    return {"gpu": "cpu (TRITON_INTERPRET=1)", "sm_count": 0}


@functools.cache
def sm_count(device: torch.device | int | None = None) -> int:
    """Multiprocessors of a CUDA device (the current one by default), which persistent kernels
    size their grids by."""
    return torch.cuda.get_device_properties(
        torch.cuda.current_device() if device is None else device
    ).multi_processor_count


def interpreter_banner() -> str:
    """The line a phase prints so nobody mistakes a CPU smoke run for a measurement."""
    if ON_GPU:
        info = describe_device()
        return f"device: {info['gpu']} ({info['sm_count']} SMs)"
    return (
        "device: no CUDA GPU found -- running on the CPU with TRITON_INTERPRET=1 and a tiny shape; "
        "the timings below check that the code runs, they are not measurements"
    )
