"""Argument checks shared by the kernels: a clear ``ValueError`` before any launch, never a crash inside one."""

import torch
import triton

import common

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# One row lives in registers; a wider row would spill (and RMSNorm's specification stops here).
MAX_ROW = 65536


def check_float(name: str, t, dtypes=FLOAT_DTYPES) -> None:
    """``t`` is a tensor on the device the kernels run on, with one of ``dtypes``."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != common.DEVICE.type:
        raise ValueError(f"{name}: expected a tensor on {common.DEVICE.type}, got one on {t.device}")
    if t.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{name}: unsupported dtype {t.dtype}; expected one of {names}")


def check_same(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor, *, shape: bool = True) -> None:
    if t.device != ref.device:
        raise ValueError(f"{name}: on {t.device}, but {ref_name} is on {ref.device}")
    if t.dtype != ref.dtype:
        raise ValueError(f"{name}: dtype {t.dtype} differs from {ref_name}'s {ref.dtype}")
    if shape and t.shape != ref.shape:
        raise ValueError(f"{name}: shape {tuple(t.shape)} differs from {ref_name}'s {tuple(ref.shape)}")


def check_row_width(name: str, n: int) -> None:
    if not 1 <= n <= MAX_ROW:
        raise ValueError(f"{name}: last dimension must be in [1, {MAX_ROW}], got {n}")


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
    block_n = triton.next_power_of_2(n_cols)
    block_m = max(1, min(16, 2048 // block_n))
    num_warps = min(32, max(4, block_m * block_n // 512))
    return block_m, block_n, num_warps


def persistent_programs(n_work: int, per_sm: float = 2) -> int:
    """How many programs a persistent kernel launches: ``per_sm`` per SM on a GPU, a handful in the interpreter."""
    slots = int(common.sm_count() * per_sm) if common.ON_GPU else 4
    return max(1, min(n_work, slots))
