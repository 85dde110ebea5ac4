"""Short slices: each kernel of fixed_slice_matmul forced by ``impl`` against cuBLAS on the slice
(``dy[:N] @ w``; ``short-slice-only``: the short-slice kernel on dy[:N], no zero tiles) and against
the same output made by torch (``dx[N:].zero_()`` then
``torch.mm(dy[:N], w, out=dx[:N])``), at bert-base's two FFN dX GEMMs, bf16, GPU time (each call
behind a 1 ms GPU sleep, as the phase times it). N = 0 also times ``torch.zeros``. Prints the
short-slice kernel's tuner timings per config. (Until 8d2aed2 that kernel could split K: impl "split".)

    PYTHONPATH=. python3 reports/data/sparse_ffn/diagnostics/split_k/split_k.py   (OUT=<dir> for the CSV)
"""

import csv
import os

import torch

from common.timing import bench
from tritonlab import sparse_ffn
from tritonlab.tuning import ConfigRecord, describe_config

SHAPES = [(4096, 3072, 768), (4096, 768, 3072), (16384, 3072, 768), (16384, 768, 3072)]
FRACTIONS = [0, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1]


def timed(fn):
    return bench(fn, head_start_ms=1.0).ms


def measure(dy, w, n: int) -> list[dict]:
    T, K = dy.shape
    D = w.shape[1]
    times = {"cublas-slice": timed(lambda: dy[:n] @ w)}

    def same_output():
        dx = torch.empty(T, D, device="cuda", dtype=torch.bfloat16)
        dx[n:].zero_()
        torch.mm(dy[:n], w, out=dx[:n])
        return dx

    times["cublas-slice+zeros"] = timed(same_output)
    if n == 0:
        times["torch-zeros"] = timed(lambda: torch.zeros(T, D, device="cuda", dtype=torch.bfloat16))
    ref = same_output()
    picks = {}
    for impl in ("auto", "short", "tma", "gluon", "pointer"):
        if n == 0 and impl in ("short", "tma", "gluon"):
            continue
        record = ConfigRecord()
        out = sparse_ffn.fixed_slice_matmul(dy, w, n, impl=impl, record=record)
        assert torch.equal(out[n:], torch.zeros_like(out[n:])), impl
        err = ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()
        assert err < 1e-2, (impl, err)
        times[impl] = timed(lambda impl=impl: sparse_ffn.fixed_slice_matmul(dy, w, n, impl=impl))
        picks[impl] = record.picked.get("fixed_slice_matmul", "")
        if impl == "short":
            for config, t in sparse_ffn._fixed_slice_matmul_short.configs_timings.items():
                ms = float(t[0] if isinstance(t, list | tuple) else t)
                print(f"  tuner {T}x{K}->{D} N={n}: {ms * 1e3:7.1f} us {describe_config(config)}")
    if n:  # the short-slice kernel on the slice alone: its product without the zero tiles
        times["short-slice-only"] = timed(lambda: sparse_ffn.fixed_slice_matmul(dy[:n], w, n, impl="short"))
    line = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in times.items())
    print(
        f"{T}x{K}->{D} N={n}: {line} (us); short pick {picks.get('short', '')}; auto {picks['auto']}",
        flush=True,
    )
    return [
        {"T": T, "K": K, "D": D, "n_rows": n, "variant": v, "ms": ms, "config": picks.get(v, "")}
        for v, ms in times.items()
    ]


def main():
    rows = []
    for T, K, D in SHAPES:
        torch.manual_seed(0)
        dy = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(K, D, device="cuda") / K**0.5).to(torch.bfloat16)
        for fraction in FRACTIONS:
            rows += measure(dy, w, int(T * fraction))
    with open(os.path.join(os.environ.get("OUT", "."), "split_k.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
