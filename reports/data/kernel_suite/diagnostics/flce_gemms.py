"""The fused linear cross-entropy's three GEMMs alone, per chunk size: where its time over
``torch.compile`` (which runs each GEMM once over all tokens) comes from.

At (tokens, 4096, vocab) in bf16, for chunks of R rows, each GEMM is timed over one chunk and scaled
to all tokens (x tokens / R): the logits ``z = x_c W^T`` (R x V), dx ``= G W`` and dW ``= G^T x_c``,
the last both as the first chunk makes it (beta = 0) and as the others do (``addmm_``, beta = 1).
The same three with G stored transposed (V x R) say what that layout would buy. The kernel cuBLAS
picks is named from one profiled call each.

    PYTHONPATH=. python3 reports/data/kernel_suite/diagnostics/flce_gemms.py [TOKENSxVOCAB]
"""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from common.timing import bench

HIDDEN = 4096


def kernel_name(fn) -> str:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.key for e in prof.key_averages() if e.device_type.name == "CUDA"]
    return ";".join(n[:60] for n in names)


def main(tokens: int, vocab: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(tokens, HIDDEN, device="cuda").to(torch.bfloat16)
    w = (torch.randn(vocab, HIDDEN, device="cuda") / HIDDEN**0.5).to(torch.bfloat16)
    dw = torch.empty_like(w)
    print(f"# {tokens}x{vocab}x{HIDDEN} bf16, {torch.cuda.get_device_name()}", flush=True)
    for rows in (2048, 3328, 4096, 8192, tokens):
        if rows <= tokens:
            time_chunk(x[:rows], w, dw, tokens)


def gemms(xc, w, dw):
    """The GEMMs of one chunk of rows ``xc``, over a G (and a transposed G^T) of random values."""
    z = torch.randn(xc.shape[0], w.shape[0], device="cuda").to(torch.bfloat16) * 1e-3
    zt = z.t().contiguous()  # (V, R): G stored transposed
    dx = torch.empty_like(xc)
    return {
        "logits": lambda: torch.mm(xc, w.t(), out=z),
        "dx": lambda: torch.mm(z, w, out=dx),
        "dW beta0": lambda: torch.mm(z.t(), xc, out=dw),
        "dW beta1": lambda: dw.addmm_(z.t(), xc),
        "logits^T": lambda: torch.mm(w, xc.t(), out=zt),
        "dx from G^T": lambda: torch.mm(zt.t(), w, out=dx),
        "dW beta1 from G^T": lambda: dw.addmm_(zt, xc),
    }


def time_chunk(xc, w, dw, tokens: int) -> None:
    rows = xc.shape[0]
    scale = tokens / rows
    total = {}
    for name, fn in gemms(xc, w, dw).items():
        ms = bench(fn, warmup_ms=200, rep_ms=600).ms
        total[name] = ms * scale
        print(
            f"R={rows:6d} {name:18s} {ms:8.3f} ms/chunk  {ms * scale:8.2f} ms over {tokens} tokens"
            f"  {2 * HIDDEN * w.shape[0] * rows / ms / 1e9:6.1f} TFLOP/s  {kernel_name(fn)}",
            flush=True,
        )
    plain = total["logits"] + total["dx"] + total["dW beta1"]
    transposed = total["logits^T"] + total["dx from G^T"] + total["dW beta1 from G^T"]
    print(
        f"R={rows:6d} logits + dx + dW over all tokens: {plain:.2f} ms; with G^T: {transposed:.2f} ms",
        flush=True,
    )


if __name__ == "__main__":
    shape = sys.argv[1] if len(sys.argv) > 1 else "16384x128256"
    main(*(int(n) for n in shape.split("x")))
