"""What every autotuned kernel shares: the precision of its dots, the configs that fit the GPU, and
an explicit record of the config each launch picked.

- float32 inputs give float32 results. ``dot_precision`` follows PyTorch's own switch,
  ``torch.get_float32_matmul_precision()``: "highest" (the default) means IEEE float32 dots;
  "high" or "medium" allow TF32, as they do for ``torch.matmul``. 16-bit dots ignore it.
- ``fits_shared_memory`` prunes a config space by the element size of the inputs and the shared
  memory of the GPU the kernel runs on, so a float32 call never asks for more than the hardware has.
- ``quiet_compile_failures`` turns a config the compiler cannot build, while tuning, into one
  warning line instead of Triton's dump of the whole PTX.
- ``ptxas_report``: registers and spills of a kernel's PTX for a GPU that need not be present (the
  A100 table check, the tests' sm_90 builds on a machine without a GPU).
- ``ConfigRecord`` keeps the config a kernel's launch picked, per kernel, for whoever asked for it
  (a benchmark row); nothing is kept in module globals. Under ``torch.compile`` the kernels run
  inside custom ops, which a record cannot reach: ``refuse_record_under_compile``.

How each autotuned kernel is registered, and the tables of tuned configs it looks up before timing
anything: ``tuning_tables``.
"""

import contextlib
import functools
import hashlib
import io
import logging
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ._runtime import INTERPRET

logger = logging.getLogger("tritonlab")


def dot_precision(dtype: torch.dtype) -> str:
    """``input_precision`` for ``tl.dot`` on inputs of ``dtype``: "ieee" for float32 unless PyTorch
    allows TF32 (``torch.set_float32_matmul_precision("high")``), "tf32" otherwise (ignored for
    16-bit inputs, whose dots are exact products with float32 sums either way)."""
    if dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest":
        return "ieee"
    return "tf32"


# Hopper's (H100/H200) opt-in shared memory per block: the fallback where the driver does not say,
# and the budget the CPU tests build sm_90a kernels against.
HOPPER_SHARED_MEMORY = 232_448


@functools.cache
def shared_memory_bytes(device_index: int | None = None) -> int:
    """The most shared memory one program may use on this GPU (opt-in limit, per block)."""
    if INTERPRET:
        return 1 << 30  # the interpreter has no limit; only a test's time does
    index = torch.cuda.current_device() if device_index is None else device_index
    props = torch.cuda.get_device_properties(index)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or HOPPER_SHARED_MEMORY)


def fits_shared_memory(need_bytes: int, device_index: int | None = None, headroom: float = 1.0) -> bool:
    """Whether a config that stages ``need_bytes`` in shared memory can launch on this GPU."""
    return need_bytes * headroom <= shared_memory_bytes(device_index)


def pipelined_tile_bytes(tile_elems: int, element_size: int, num_stages: int) -> int:
    """Shared memory of a software-pipelined loop: each stage buffers its input tiles."""
    return tile_elems * element_size * max(num_stages, 1)


def describe_config(config) -> str:
    """A ``triton.Config`` as one short string for a CSV cell: tile sizes, warps, stages."""
    if config is None:
        return ""
    parts = [f"{k}={v}" for k, v in config.kwargs.items()]
    parts += [f"warps={config.num_warps}", f"stages={config.num_stages}"]
    return ",".join(parts)


@dataclass
class ConfigRecord:
    """The configs the launches of a call picked, by kernel name: pass one to a public function's
    ``record=`` argument and read ``record.picked`` afterwards."""

    picked: dict[str, str] = field(default_factory=dict)

    def note(self, kernel: str, config) -> None:
        self.picked[kernel] = config if isinstance(config, str) else describe_config(config)


def refuse_record_under_compile(record: ConfigRecord | None, function: str) -> None:
    """On a public function's torch.compile route: a ``ValueError`` if its caller passed a record.

    Traced, the public functions run their kernels inside ``torch.library`` custom ops, whose
    arguments are tensors and numbers: a record cannot travel with them, and dropping it silently
    would leave the caller an empty record. (With ``fullgraph=True`` Dynamo reports the error as an
    "Observed exception" that quotes this message.)"""
    if record is not None:
        raise ValueError(
            f"record: {function} cannot fill a ConfigRecord under torch.compile (its kernels run inside "
            "a custom op); call it eagerly to learn the configs"
        )


_REGISTERS = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _ptxas(ptx: str, gpu_name: str, tmp: Path, *flags: str) -> tuple[subprocess.CompletedProcess, Path]:
    """``ptx`` built into a cubin in ``tmp`` for ``gpu_name`` by the ptxas Triton uses: its run and the cubin."""
    from triton import knobs

    src, cubin = tmp / "k.ptx", tmp / "k.cubin"
    src.write_text(ptx)
    out = subprocess.run(
        [knobs.nvidia.ptxas.path, *flags, f"--gpu-name={gpu_name}", str(src), "-o", str(cubin)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out, cubin


def ptxas_report(ptx: str, gpu_name: str) -> dict:
    """Registers and spill bytes of ``ptx`` built for ``gpu_name`` (``sm_80``, ``sm_90a``) by the ptxas
    Triton uses, with ``-v``: the most registers of any function in it (the kernel, and any function
    left out of line) and the total spill stores and loads."""
    with tempfile.TemporaryDirectory() as tmp:
        out, _ = _ptxas(ptx, gpu_name, Path(tmp), "-lineinfo", "-v")
    return parse_ptxas_log(out.stderr + out.stdout)


def sass(ptx: str, gpu_name: str) -> str:
    """The SASS of ``ptx`` built for ``gpu_name`` by the ptxas Triton uses, as its cuobjdump prints it
    (instruction counts: special-function ops, barriers)."""
    from triton import knobs

    with tempfile.TemporaryDirectory() as tmp:
        _, cubin = _ptxas(ptx, gpu_name, Path(tmp))
        return subprocess.run(
            [knobs.nvidia.cuobjdump.path, "-sass", str(cubin)], capture_output=True, text=True, check=True
        ).stdout


def sass_fingerprint(ptx: str, gpu_name: str) -> dict:
    """The build of ``ptx`` for ``gpu_name`` in two figures (``fingerprint``)."""
    return fingerprint(sass(ptx, gpu_name))


def fingerprint(code: str) -> dict:
    """A cuobjdump SASS listing in two figures: ``sass_sha``, the first 16 hex digits of the SHA-256
    of its instructions (no addresses, no encodings, registers unnumbered, spill slots unnamed), and
    ``instructions``, their count. Tests pin the builds benchmarks timed, since a change that leaves a
    kernel's output alone can still move ptxas' schedule. Registers and spill slots go unnamed
    because ptxas (Triton 3.6's) assigns them differently from run to run for one PTX (the fused
    backward: three assignments in eight runs, the same instructions in the same order)."""
    code = "\n".join(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?;)", code, re.M))
    code = re.sub(r"\b(U?R|U?P)\d+\b", r"\1", code)
    code = re.sub(r"^((?:@!?U?P )?(?:LDL|STL)\S*.*?\[R)\+0x[0-9a-f]+\]", r"\1]", code, flags=re.M)
    return {"sass_sha": hashlib.sha256(code.encode()).hexdigest()[:16], "instructions": code.count(";")}


def parse_ptxas_log(log: str) -> dict:
    """``ptxas_report``'s figures from the text of ``ptxas -v``: one report per function."""
    regs = [int(n) for n in _REGISTERS.findall(log)]
    spills = [(int(a), int(b)) for a, b in _SPILLS.findall(log)]
    if not regs or not spills:
        raise RuntimeError(f"ptxas -v printed no register report:\n{log}")
    return {
        "registers": max(regs),
        "spill_stores": sum(a for a, _ in spills),
        "spill_loads": sum(b for _, b in spills),
    }


@contextlib.contextmanager
def quiet_compile_failures(kernel: str):
    """Around an autotuned launch: a config the compiler cannot build (Triton's autotuner skips it)
    makes Triton print the whole PTX to stdout, thousands of lines; keep that out of the user's
    terminal and say it in one warning line instead."""
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        yield
    text = captured.getvalue()
    if "ptxas" in text or "PTX" in text:
        first = next((line for line in text.splitlines() if "ptxas" in line), "a compile error")
        logger.warning(
            "%s: a config failed to compile while tuning and was skipped (%s)", kernel, first.strip()
        )
    elif text:
        sys.stdout.write(text)
