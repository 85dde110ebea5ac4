"""The tiny shared harness: device, timing, memory, provenance, CSV rows and reports.

Importing ``common`` first matters: with no CUDA device it sets ``TRITON_INTERPRET=1``
before any phase defines a Triton kernel, so every kernel also runs (slowly) on the CPU.
"""

from .device import DEVICE, ON_GPU, describe_device, interpreter_banner, sm_count
from .memory import OutOfMemory, measure_peak_memory
from .provenance import provenance
from .results import ResultWriter, failure_row
from .shapes import SHAPES, TNPShape, resolve_shape
from .timing import StageTimer, Timing, bench, graph_replay, nvtx_range

__all__ = [
    "DEVICE",
    "ON_GPU",
    "SHAPES",
    "OutOfMemory",
    "ResultWriter",
    "StageTimer",
    "TNPShape",
    "Timing",
    "bench",
    "graph_replay",
    "describe_device",
    "failure_row",
    "interpreter_banner",
    "measure_peak_memory",
    "nvtx_range",
    "provenance",
    "resolve_shape",
    "sm_count",
]
