"""Argument checks every public kernel runs first: a clear ``ValueError`` naming the argument and
what was expected, before any launch -- never a silent wrong answer or a crash inside a kernel."""

import torch

from ._runtime import kernel_device_type, next_power_of_2, sm_count

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Kernels that keep one row in registers stop here; a wider row would spill.
MAX_ROW = 65536


def dtype_names(dtypes) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(name: str, t, dtypes=FLOAT_DTYPES, ndim: int | None = None) -> None:
    """``t`` is a tensor on the device the kernels run on, with one of ``dtypes`` (and ``ndim`` dims)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    device = kernel_device_type()
    if t.device.type != device:
        raise ValueError(f"{name}: expected a tensor on {device}, got one on {t.device}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name}: unsupported dtype {t.dtype}; expected one of {dtype_names(dtypes)}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")


def check_choice(name: str, value, choices: tuple) -> None:
    """``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name}: unknown {value!r}; expected one of {choices}")


def check_same(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor, *, shape: bool = True) -> None:
    """``t`` has ``ref``'s device and dtype (and shape, unless ``shape=False``)."""
    if t.device != ref.device:
        raise ValueError(f"{name}: on {t.device}, but {ref_name} is on {ref.device}")
    if t.dtype != ref.dtype:
        raise ValueError(f"{name}: dtype {t.dtype} differs from {ref_name}'s {ref.dtype}")
    if shape and t.shape != ref.shape:
        raise ValueError(f"{name}: shape {tuple(t.shape)} differs from {ref_name}'s {tuple(ref.shape)}")


def check_row_width(name: str, n: int, most: int = MAX_ROW) -> None:
    if not 1 <= n <= most:
        raise ValueError(f"{name}: last dimension must be in [1, {most}], got {n}")


def check_offset_range(name: str, rows: int, widest_row: int) -> None:
    """Kernels that index rows with 32-bit offsets: refuse, rather than wrap around, when the widest
    (rows, ·) matrix they address -- ``widest_row`` values a row, counted padded -- reaches 2**31."""
    if rows * widest_row >= 2**31:
        raise ValueError(
            f"{name}: {rows} rows x {widest_row} values reach 2**31, past the kernels' 32-bit offsets"
        )


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """A 2-D (rows, last dim) view of ``t`` whose last dimension has unit stride (a copy only if needed).

    A row stride other than the width is fine (the kernels take it); a zero or non-unit stride in the
    last dimension -- an expanded upstream gradient, a transposed view -- is made contiguous.
    """
    if t.dim() == 0:
        t = t.reshape(1)
    rows = t.reshape(-1, t.shape[-1])
    if rows.stride(-1) != 1 or rows.stride(0) < rows.shape[-1]:
        rows = rows.contiguous()
    return rows


def row_block_settings(n_cols: int) -> tuple[int, int, int]:
    """(rows per program, padded row width, warps) for kernels that hold whole rows in registers.

    About 16 fp32 values per thread: narrow rows are packed several to a program so each program
    still moves a few KB; wide rows get more warps (32 at most, 64 values a thread at 65 536).
    """
    block_n = next_power_of_2(n_cols)
    block_m = max(1, min(16, 2048 // block_n))
    num_warps = min(32, max(4, block_m * block_n // 512))
    return block_m, block_n, num_warps


def persistent_programs(n_work: int, per_sm: float = 2, device=None) -> int:
    """How many programs a persistent kernel launches: ``per_sm`` per SM (a handful in the interpreter)."""
    return max(1, min(n_work, int(sm_count(device) * per_sm)))
