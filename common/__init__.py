"""The lab's harness: device, timing, the benchmark runner, memory, provenance, CSV rows, reports.

Importing it changes nothing in the environment; see ``common.device`` for the interpreter switch.
"""

from .device import DEVICE, ON_GPU, describe_device, interpreter_banner, use_interpreter_without_gpu
from .memory import OutOfMemory, measure_peak_memory
from .provenance import provenance
from .results import ResultWriter, failure_row
from .runner import Cell, check_close, run_cells, timed
from .timing import StageTimer, Timing, bench, graph_replay, nvtx_range

__all__ = [
    "DEVICE",
    "ON_GPU",
    "Cell",
    "OutOfMemory",
    "ResultWriter",
    "StageTimer",
    "Timing",
    "bench",
    "check_close",
    "describe_device",
    "failure_row",
    "graph_replay",
    "interpreter_banner",
    "measure_peak_memory",
    "nvtx_range",
    "provenance",
    "run_cells",
    "timed",
    "use_interpreter_without_gpu",
]
