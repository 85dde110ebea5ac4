"""Where dx's zero rows are written, at bert-base's dX GEMMs (bf16): each kernel against cuBLAS on the
slice and against cuBLAS on the slice after a memset of the rest, GPU time (each call behind a 1 ms
GPU sleep, as the phase times it), N = rows/4, rows/2 and all. Run once per kernel revision in the
same process or call and compare the ratios.

    PYTHONPATH=. python3 reports/data/sparse_ffn/diagnostics/zero_overlap.py [LABEL]
"""

import sys

import torch

from common.timing import bench
from tritonlab import sparse_ffn
from tritonlab.tuning import ConfigRecord

# (rows, K, D): the intermediate dX (K = 3 072) and the output dX (K = 768) at 4 096 and 16 384 rows
SHAPES = [(4096, 3072, 768), (4096, 768, 3072), (16384, 3072, 768), (16384, 768, 3072)]
IMPLS = ["auto", "tma", "gluon"]


def time_shape(label: str, rows: int, k: int, d: int):
    dy = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(k, d, device="cuda", dtype=torch.bfloat16)
    zeroed = torch.empty(rows, d, device="cuda", dtype=torch.bfloat16)
    for n in (rows // 4, rows // 2, rows):
        ref = dy[:n].float() @ w.float()

        def slice_and_zeros(n=n):
            zeroed[n:].zero_()
            torch.mm(dy[:n], w, out=zeroed[:n])

        cublas = bench(lambda n=n: dy[:n] @ w, head_start_ms=1.0).ms
        zeros = bench(slice_and_zeros, head_start_ms=1.0).ms
        for impl in IMPLS:
            if impl == "gluon" and k < 2048:
                continue
            record = ConfigRecord()
            out = sparse_ffn.fixed_slice_matmul(dy, w, n, impl=impl, record=record)
            ok = bool((out[n:] == 0).all()) and bool((out[:n].float() - ref).norm() <= 1e-2 * ref.norm())
            ms = bench(
                lambda n=n, impl=impl: sparse_ffn.fixed_slice_matmul(dy, w, n, impl=impl), head_start_ms=1.0
            ).ms
            print(
                f"{label}: {rows}x{k}@{k}x{d} N={n} {impl}: {ms * 1e3:.1f} us; cuBLAS slice {cublas * 1e3:.1f} "
                f"({cublas / ms:.3f}x), slice+zeros {zeros * 1e3:.1f} ({zeros / ms:.3f}x); correct {ok}; "
                f"{record.picked.get('fixed_slice_matmul')}",
                flush=True,
            )


def main(label: str):
    torch.manual_seed(0)
    for rows, k, d in SHAPES:
        time_shape(label, rows, k, d)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "run")
