"""Diagnostic behind tritonlab.sparse_ffn's TMA tiles: fixed-slice matmul variants launched directly
(TMA persistent, TMA with a 128 + 64 column split, one tile per program; warp specialisation last) against
cuBLAS on dy[:n], bf16, at BERT-base's two dX GEMMs. Run on the H100 at 7659eb5 from the repository
root as `python3 reports/data/sparse_ffn/diagnostics/tile_sweep.py` (OUT=<dir> for the CSV): run1 is
the first version of this script (TILES x kinds, n in {T/8, T/2, T, 1000}), run2 this one. Its timer
has no head start: a variant's time can include host time where the host is slower than a 30 us call
(the `pointer_ms` column of run1, through the autotuner, is that; run2 leaves it out).
"""

import csv
import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from common.timing import bench

ON_GPU = torch.cuda.is_available()
dev = "cuda" if ON_GPU else "cpu"


@triton.jit
def tile_of(tile, n_m, n_n, GROUP_M: tl.constexpr):
    per_group = GROUP_M * n_n
    first_m = (tile // per_group) * GROUP_M
    gsize = tl.minimum(n_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % gsize, (tile % per_group) // gsize


@triton.jit
def persistent(
    dy_desc,
    w_desc,
    dx_desc,
    T,
    N_ROWS,
    K,
    D,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PROGRAMS: tl.constexpr,
    FLATTEN: tl.constexpr,
    WS: tl.constexpr,
):
    start = tl.program_id(0)
    n_m = tl.cdiv(N_ROWS, BLOCK_M)
    n_n = tl.cdiv(D, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(start, n_m * n_n, PROGRAMS, flatten=FLATTEN, warp_specialize=WS):
        pid_m, pid_n = tile_of(tile, n_m, n_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = dy_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            b = w_desc.load([ki * BLOCK_K, pid_n * BLOCK_N])
            acc = tl.dot(a, b, acc)
        dx_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(dx_desc.dtype))
    zero_tiles = (tl.cdiv(T, BLOCK_M) - n_m) * n_n
    for z in range(start, zero_tiles, PROGRAMS):
        dx_desc.store(
            [(n_m + z // n_n) * BLOCK_M, (z % n_n) * BLOCK_N],
            tl.zeros((BLOCK_M, BLOCK_N), dtype=dx_desc.dtype),
        )


@triton.jit
def persistent2(
    dy_desc,
    w_desc,
    w2_desc,
    dx_desc,
    dx2_desc,
    T,
    N_ROWS,
    K,
    D,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EXTRA_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PROGRAMS: tl.constexpr,
    FLATTEN: tl.constexpr,
    WS: tl.constexpr,
):
    start = tl.program_id(0)
    n_m = tl.cdiv(N_ROWS, BLOCK_M)
    WIDTH: tl.constexpr = BLOCK_N + EXTRA_N
    n_n = tl.cdiv(D, WIDTH)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(start, n_m * n_n, PROGRAMS, flatten=FLATTEN, warp_specialize=WS):
        pid_m, pid_n = tile_of(tile, n_m, n_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_M, EXTRA_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = dy_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            b = w_desc.load([ki * BLOCK_K, pid_n * WIDTH])
            b2 = w2_desc.load([ki * BLOCK_K, pid_n * WIDTH + BLOCK_N])
            acc = tl.dot(a, b, acc)
            acc2 = tl.dot(a, b2, acc2)
        dx_desc.store([pid_m * BLOCK_M, pid_n * WIDTH], acc.to(dx_desc.dtype))
        dx2_desc.store([pid_m * BLOCK_M, pid_n * WIDTH + BLOCK_N], acc2.to(dx2_desc.dtype))
    zero_tiles = (tl.cdiv(T, BLOCK_M) - n_m) * n_n
    for z in range(start, zero_tiles, PROGRAMS):
        dx_desc.store(
            [(n_m + z // n_n) * BLOCK_M, (z % n_n) * WIDTH], tl.zeros((BLOCK_M, BLOCK_N), dtype=dx_desc.dtype)
        )
        dx2_desc.store(
            [(n_m + z // n_n) * BLOCK_M, (z % n_n) * WIDTH + BLOCK_N],
            tl.zeros((BLOCK_M, EXTRA_N), dtype=dx2_desc.dtype),
        )


@triton.jit
def per_tile(
    dy_desc,
    w_desc,
    dx_desc,
    T,
    N_ROWS,
    K,
    D,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    n_n = tl.cdiv(D, BLOCK_N)
    pid_m, pid_n = tile_of(tl.program_id(0), tl.cdiv(T, BLOCK_M), n_n, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_end = tl.where(pid_m * BLOCK_M < N_ROWS, K, 0)
    for k0 in range(0, k_end, BLOCK_K):
        a = dy_desc.load([pid_m * BLOCK_M, k0])
        b = w_desc.load([k0, pid_n * BLOCK_N])
        acc = tl.dot(a, b, acc)
    dx_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(dx_desc.dtype))


def run_variant(kind, dy, w, n, bm, bn, bk, warps, stages, flatten=False, pps=1, ws=False):
    T, K = dy.shape
    D = w.shape[1]
    dx = torch.empty(T, D, dtype=dy.dtype, device=dy.device)
    dyd = TensorDescriptor(dy, [n, K], [dy.stride(0), 1], [bm, bk])
    wd = TensorDescriptor(w, [K, D], [w.stride(0), 1], [bk, bn])
    dxd = TensorDescriptor(dx, [T, D], [dx.stride(0), 1], [bm, bn])
    sms = torch.cuda.get_device_properties(0).multi_processor_count if ON_GPU else 4
    if kind == "persistent2":
        extra = bn // 2
        w2d = TensorDescriptor(w, [K, D], [w.stride(0), 1], [bk, extra])
        dx2d = TensorDescriptor(dx, [T, D], [dx.stride(0), 1], [bm, extra])
        tiles = triton.cdiv(T, bm) * triton.cdiv(D, bn + extra)
        programs = min(tiles, sms * pps)
        persistent2[(programs,)](
            dyd,
            wd,
            w2d,
            dxd,
            dx2d,
            T,
            n,
            K,
            D,
            BLOCK_M=bm,
            BLOCK_N=bn,
            EXTRA_N=extra,
            BLOCK_K=bk,
            GROUP_M=8,
            PROGRAMS=programs,
            FLATTEN=flatten,
            WS=ws,
            num_warps=warps,
            num_stages=stages,
        )
        return dx
    tiles = triton.cdiv(T, bm) * triton.cdiv(D, bn)
    if kind == "persistent":
        programs = min(tiles, sms * pps)
        persistent[(programs,)](
            dyd,
            wd,
            dxd,
            T,
            n,
            K,
            D,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            GROUP_M=8,
            PROGRAMS=programs,
            FLATTEN=flatten,
            WS=ws,
            num_warps=warps,
            num_stages=stages,
        )
    else:
        per_tile[(tiles,)](
            dyd,
            wd,
            dxd,
            T,
            n,
            K,
            D,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            GROUP_M=8,
            num_warps=warps,
            num_stages=stages,
        )
    return dx


CANDS = [
    ("persistent", 128, 256, 64, 8, 3, True, 1, False),
    ("persistent", 128, 256, 64, 8, 3, False, 1, False),
    ("persistent", 128, 256, 64, 8, 4, True, 1, False),
    ("persistent", 128, 256, 64, 8, 4, False, 1, False),
    ("persistent", 128, 128, 64, 8, 4, True, 1, False),
    ("persistent", 128, 128, 64, 4, 4, True, 1, False),
    ("persistent", 128, 128, 64, 8, 5, True, 1, False),
    ("persistent", 128, 256, 32, 8, 6, True, 1, False),
    ("per_tile", 128, 128, 64, 8, 3, False, 1, False),
    ("per_tile", 128, 256, 64, 8, 4, False, 1, False),
    ("persistent2", 128, 128, 64, 8, 3, True, 1, False),
    ("persistent2", 128, 128, 64, 8, 3, False, 1, False),
    ("persistent2", 128, 128, 64, 8, 4, True, 1, False),
    ("persistent2", 128, 128, 64, 8, 4, False, 1, False),
    ("persistent2", 64, 128, 64, 4, 4, True, 1, False),
    ("persistent2", 64, 128, 64, 4, 4, True, 2, False),
    ("persistent2", 128, 128, 32, 8, 6, True, 1, False),
    ("persistent2", 128, 128, 128, 8, 2, True, 1, False),
    # warp-specialised last: a hang costs only the rest of the run
    ("persistent", 128, 256, 64, 8, 3, False, 1, True),
    ("persistent2", 128, 128, 64, 8, 3, False, 1, True),
    ("persistent", 128, 128, 64, 4, 4, False, 1, True),
]
if not ON_GPU:
    CANDS = [
        (k, 32, 32, 32, 1, 1, f, 1, False)
        for k in ("persistent", "persistent2", "per_tile")
        for f in (False, True)
    ]


def time_variant(dy, w, n, ref, cand, kw) -> tuple[float, float, bool]:
    """(ms, relative error, zeros past n) of one candidate; ms is NaN where the result is wrong."""
    kind, bm, bn, bk, wa, st, flatten, pps, ws = cand

    def fn():
        return run_variant(kind, dy, w, n, bm, bn, bk, wa, st, flatten, pps, ws)

    o = fn()
    err = ((o[:n].float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    zero = bool((o[n:] == 0).all())
    return (bench(fn, **kw).ms if err < 2e-2 and zero else float("nan")), err, zero


def main():
    out = os.environ.get("OUT", "/tmp")
    shapes = [(4096, 3072, 768), (4096, 768, 3072), (16384, 3072, 768), (16384, 768, 3072)]
    if not ON_GPU:
        shapes = [(70, 48, 40)]
    kw = {"warmup_ms": 25, "rep_ms": 100} if ON_GPU else {"warmup_ms": 1, "rep_ms": 1, "min_reps": 1}
    with open(os.path.join(out, "sffn_probe.csv"), "w", newline="") as f:
        writer = None
        for T, K, D in shapes:
            torch.manual_seed(0)
            dy = torch.randn(T, K, device=dev, dtype=torch.bfloat16 if ON_GPU else torch.float16)
            w = (torch.randn(K, D, device=dev, dtype=dy.dtype) / K**0.5).to(dy.dtype)
            for n in sorted({T, T // 2} if ON_GPU else {T, T // 2, 7}):
                ref = dy[:n].float() @ w.float()
                sliced = dy[:n]
                bench(lambda sliced=sliced, w=w: sliced @ w, **kw)  # warms cuBLAS and the clocks
                base = bench(lambda sliced=sliced, w=w: sliced @ w, **kw).ms
                cands = []
                for cand in CANDS:
                    kind, bm, bn, bk, wa, st, flatten, pps, ws = cand
                    name = f"{kind},{bm}x{bn}x{bk},w{wa},s{st},flat{int(flatten)},pps{pps},ws{int(ws)}"
                    try:
                        ms, err, zero = time_variant(dy, w, n, ref, cand, kw)
                    except Exception as e:  # noqa: BLE001 - a config that fails to compile is a row
                        ms, err, zero = float("nan"), float("nan"), False
                        print(name, "failed", type(e).__name__, str(e)[:200], flush=True)
                    row = dict(T=T, K=K, D=D, n=n, variant=name, ms=ms, err=err, zeros_ok=zero,
                               cublas_slice_ms=base, pointer_ms=float("nan"))  # fmt: skip
                    if writer is None:
                        writer = csv.DictWriter(f, fieldnames=list(row))
                        writer.writeheader()
                    writer.writerow(row)
                    f.flush()
                    cands.append((ms, name))
                best = min((c for c in cands if c[0] == c[0]), default=(float("nan"), "-"))
                print(f"T={T} K={K} D={D} n={n}: cublas {base * 1e3:.1f}us best {best[1]} "
                      f"{best[0] * 1e3:.1f}us ({base / best[0]:.3f}x)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
