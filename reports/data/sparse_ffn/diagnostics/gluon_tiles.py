"""The Gluon sliced-dX kernel's K block and ring depth at bert-base's intermediate dX (4 096 x 3 072 @
3 072 x 768, N = all rows, bf16), against cuBLAS on the slice, GPU time (each call behind a 1 ms GPU
sleep, as the phase times it), two rounds each.

    PYTHONPATH=. python3 reports/data/sparse_ffn/diagnostics/gluon_tiles.py   (CONFIGS="64x4,64x5")
"""

import os

import torch

from common.timing import bench
from tritonlab import sparse_ffn

# (BLOCK_K, STAGES): the ring, then the store's staging, fit 227 KB; CONFIGS="64x4,64x5" picks others
CONFIGS = [
    tuple(int(v) for v in c.split("x")) for c in os.environ.get("CONFIGS", "64x4,64x3,128x2").split(",")
]


def main():
    torch.manual_seed(0)
    dy = torch.randn(4096, 3072, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(3072, 768, device="cuda", dtype=torch.bfloat16)
    ref = dy @ w
    for r in range(2):
        cublas = bench(lambda: dy @ w, head_start_ms=1.0).ms
        for block_k, stages in CONFIGS:
            sparse_ffn._WS_BLOCK_K, sparse_ffn._WS_STAGES = block_k, stages
            sparse_ffn._WS_LAUNCHES.clear()
            out = sparse_ffn.fixed_slice_matmul(dy, w, 4096, impl="gluon")
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            ms = bench(lambda: sparse_ffn.fixed_slice_matmul(dy, w, 4096, impl="gluon"), head_start_ms=1.0).ms
            print(
                f"round {r}: BLOCK_K {block_k}, stages {stages}: {ms * 1e3:.1f} us, cuBLAS {cublas * 1e3:.1f} us, "
                f"{cublas / ms:.3f}x; rel err against cuBLAS {err:.1e}",
                flush=True,
            )


if __name__ == "__main__":
    main()
