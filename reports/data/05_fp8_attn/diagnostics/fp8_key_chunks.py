"""What running long rows in key chunks costs the Gluon FP8 forward, and what it buys: at phase 05's
large shape (D = 64 and 128, the model's layouts), ``fp8_hopper.forward`` in 1, 2 and 4 key chunks
(the K/V quantisation launch included), in alternating rounds beside SDPA cuDNN, with the relative
Frobenius error of O against cuDNN's.

    PYTHONPATH=. python3 reports/data/05_fp8_attn/diagnostics/fp8_key_chunks.py
"""

import pathlib
import sys

import torch
from triton.testing import do_bench

from common.attention_bench import Case, make_inputs
from tritonlab.attention import fp8_hopper


def compare(d: int) -> None:
    from gluon_fp8_configs import cudnn, rel
    from patched import fp8_forward

    def chunked(q, k, v, split: int):
        return fp8_forward(fp8_hopper, q, k, v, split=split)

    q, k, v = make_inputs(Case(f"large-d{d}", 1, 205_000, 200_000, 512 // d, d), torch.bfloat16, grad=False)[
        :3
    ]
    ref = cudnn(q, k, v)
    errors = {s: rel(chunked(q, k, v, s), ref) for s in (1, 2, 4)}
    print(
        f"D {d}: default chunks {fp8_hopper.key_chunks(200_000, fp8_hopper.CONFIGS[d][0])}; error of O "
        + "  ".join(f"{s} chunk(s) {e:.4f}" for s, e in errors.items()),
        flush=True,
    )
    for r in range(2):
        base = do_bench(lambda: cudnn(q, k, v), warmup=1, rep=5)
        times = {s: do_bench(lambda s=s: chunked(q, k, v, s), warmup=1, rep=5) for s in (1, 2, 4)}
        print(
            f"D {d} round {r}: cudnn {base:.1f} ms  "
            + "  ".join(f"{s} chunk(s) {t:.1f} ({base / t:.3f}x)" for s, t in times.items()),
            flush=True,
        )


def main() -> None:
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    print(
        f"# {torch.cuda.get_device_name()}: large (B 1, Lq 205 000, Lk 200 000), H·D = 512, bf16", flush=True
    )
    for d in (64, 128):
        compare(d)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
