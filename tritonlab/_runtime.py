"""Where the kernels run: a CUDA GPU, or Triton's interpreter on the CPU.

Triton decides when a kernel is decorated whether it is interpreted, from ``TRITON_INTERPRET``;
this module reads the variable once, at the same moment, so every launch wrapper agrees with the
kernels it launches. It never sets the variable (see the package docstring).
"""

import functools
import logging
import os
import threading

import torch

INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ for host code: ``triton.cdiv`` is a constexpr function in Triton 3.6, whose wrapper
    costs about 2 µs of host time a call against 0.06 µs here (launch paths call it several times)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of two >= n (0 for 0), as ``triton.next_power_of_2`` without its wrapper."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def kernel_device_type() -> str:
    """The device type the kernels accept: ``cpu`` in the interpreter, ``cuda`` otherwise."""
    return "cpu" if INTERPRET else "cuda"


def autocast_dtype(t: torch.Tensor) -> torch.dtype | None:
    """The dtype autocast computes in on ``t``'s device where it is on there, else None."""
    device = t.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None


@functools.cache
def capability(device: torch.device | int | None = None) -> tuple[int, int]:
    """A CUDA device's compute capability (the current one by default), read once: the kernels'
    dispatch asks on every call, and torch's query costs microseconds each time."""
    if isinstance(device, torch.device):
        device = device.index
    return torch.cuda.get_device_capability(torch.cuda.current_device() if device is None else device)


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


@functools.cache
def preload() -> threading.Thread | None:
    """Start, in a background thread, the work done once per process at the first launches, so that
    it overlaps what a training script does before its first step (building the model, loading data)
    instead of adding to that step:

    - Triton's: hashing its own sources and ``libtriton`` into the compile-cache key (0.41 s of a 0.97 s
      first step of the TransformerNP at mid, under cProfile on the H100) and importing the Gluon
      modules its argument specialisation loads (0.11 s);
    - PyTorch's, with a CUDA device: a bf16 linear and an RMSNorm, forward and backward, at a tiny
      shape (``_warm_torch``). In a fresh process on the H100 the first bf16 linear at mid's shape
      took 109.5 ms, the first RMSNorm 14.4 ms, the first backward 66.4 ms; after the tiny warm-up 3.0,
      0.3 and 15.5 ms (``reports/data/11_autotune/diagnostics/first_use*``): once per process, not
      per shape (cuBLAS's set-up, the lazily loaded kernels, the autograd engine's device thread).

    PyTorch's warm-up runs only where the calling thread has already initialised CUDA, on its current
    device: a preload never creates a CUDA context, nor one on another rank's GPU.
    Once per process; returns the thread (None in the interpreter, which compiles nothing).
    ``tritonlab.models.build`` calls it for a CUDA model, on the model's device; a CUDA graph capture
    waits for it first (``join_preload``): its launches must not fall inside one."""
    if INTERPRET:
        return None
    device = torch.cuda.current_device() if torch.cuda.is_initialized() else None

    def work():
        # Only a head start: if a Triton version moves either, the first launch does the work itself.
        try:
            from triton.runtime.cache import triton_key

            triton_key()  # functools-cached by Triton: the first launch then finds it computed
            import triton.experimental.gluon.nvidia.hopper  # noqa: F401

            if device is not None:
                _warm_torch(device)
        except Exception as error:  # noqa: BLE001 -- nothing here may reach the training script
            logging.getLogger("tritonlab").debug("preload: %s", error)

    thread = threading.Thread(target=work, name="tritonlab-preload", daemon=True)
    thread.start()
    return thread


def _warm_torch(device: int) -> None:
    """A bf16 linear and an RMSNorm, forward and backward, on 8 x 64 values of CUDA device ``device``.
    No random numbers: the training's generators are left as they are."""
    with torch.cuda.device(device):
        x = torch.linspace(-1.0, 1.0, 8 * 64, device="cuda").view(8, 64).requires_grad_()
        w = torch.eye(64, device="cuda", requires_grad=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = torch.nn.functional.rms_norm(torch.nn.functional.linear(x, w), (64,), w[0], 1e-6)
        y.float().sum().backward()
        torch.cuda.synchronize()


def join_preload() -> None:
    """Wait for a preload that has started (none started: return at once)."""
    if preload.cache_info().currsize:
        thread = preload()
        if thread is not None:
            thread.join()
