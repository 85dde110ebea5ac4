"""Where the kernels run: a CUDA GPU, or Triton's interpreter on the CPU.

Triton decides when a kernel is decorated whether it is interpreted, from ``TRITON_INTERPRET``;
this module reads the variable once, at the same moment, so every launch wrapper agrees with the
kernels it launches. It never sets the variable (see the package docstring).
"""

import functools
import os

import torch

INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def kernel_device_type() -> str:
    """The device type the kernels accept: ``cpu`` in the interpreter, ``cuda`` otherwise."""
    return "cpu" if INTERPRET else "cuda"


@functools.cache
def sm_count(device: torch.device | int | None = None) -> int:
    """Multiprocessors of a CUDA device (the current one by default), which persistent kernels size
    their grids by; 4 in the interpreter, where a grid's size only decides how long a test takes."""
    if INTERPRET:
        return 4
    if isinstance(device, torch.device):
        device = device.index
    return torch.cuda.get_device_properties(
        torch.cuda.current_device() if device is None else device
    ).multi_processor_count
