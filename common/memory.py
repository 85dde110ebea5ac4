"""Peak device memory of a region, and out-of-memory turned into a result instead of a crash."""

import contextlib
from dataclasses import dataclass

import torch

from .device import ON_GPU
from .timing import l2_flush_buffer


class OutOfMemory(RuntimeError):
    """Raised by :func:`measure_peak_memory` when the region ran out of device memory."""


@dataclass
class PeakMemory:
    """Filled in when the ``with`` block ends: bytes allocated at the peak, above and including the start."""

    peak_bytes: int = 0
    start_bytes: int = 0

    @property
    def peak_gb(self) -> float:
        return self.peak_bytes / 1e9


@contextlib.contextmanager
def measure_peak_memory():
    """``with measure_peak_memory() as mem: ...`` then ``mem.peak_gb``.

    On the CPU there is no allocator to ask, so the peak stays 0. A CUDA out-of-memory
    error inside the block frees the cache and is re-raised as :class:`OutOfMemory`, which
    a sweep records as a row marked ``oom`` before it moves on.
    """
    mem = PeakMemory()
    if ON_GPU:
        l2_flush_buffer()  # allocated before the start, so every region's peak counts it alike
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        mem.start_bytes = torch.cuda.memory_allocated()
    try:
        yield mem
    except torch.OutOfMemoryError as err:
        torch.cuda.empty_cache()
        raise OutOfMemory(str(err).splitlines()[0]) from err
    if ON_GPU:
        torch.cuda.synchronize()
        mem.peak_bytes = torch.cuda.max_memory_allocated()
