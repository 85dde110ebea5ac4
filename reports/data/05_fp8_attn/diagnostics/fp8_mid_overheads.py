"""Where the FP8 forward's time goes at mid, beside large: the K/V quantisation launch alone, the
Gluon FP8 kernel alone (inputs quantised beforehand) and our bf16 Gluon forward, at the mid shape's
queries (B = 4, H = 8, Lq = 11 000, D = 64) over 10 000, 20 000 and 40 000 keys. With programs of
equal length, time = waves x (fixed + tiles x per-tile); the key sweep separates the two terms.

    PYTHONPATH=. python3 reports/data/05_fp8_attn/diagnostics/fp8_mid_overheads.py [keys ...]
"""

import functools
import math
import sys

import torch
from triton.testing import do_bench

from tritonlab.attention import attention_forward, fp8, fp8_hopper
from tritonlab.attention._common import LOG2E
from tritonlab.attention.forward import _forward_outputs

B, H, LQ, D = 4, 8, 11_000, 64
LENGTHS = [int(n) for n in sys.argv[1:]] or [10_000, 20_000, 40_000]


def strided(length):
    """(B, H, length, D) as the model makes it: a view of a (B, length, H·D) projection."""
    return (
        torch.randn(B, length, H * D, device="cuda", dtype=torch.bfloat16)
        .view(B, length, H, D)
        .transpose(1, 2)
    )


def main():
    q = strided(LQ)
    programs = B * H * math.ceil(LQ / fp8_hopper.BLOCK_M)
    print(f"{programs} programs of {fp8_hopper.BLOCK_M} rows: {programs / 132:.2f} waves on 132 SMs")
    for lk in LENGTHS:
        k, v = strided(lk), strided(lk)
        quant = do_bench(functools.partial(fp8._quantize_kv, k, v), warmup=25, rep=150)
        parts = fp8._quantize_kv(k, v)
        o, lse = _forward_outputs(q)
        kernel = do_bench(
            lambda k=k, parts=parts, o=o, lse=lse: fp8_hopper.forward(
                q, *parts[:2], *parts[2:], o, lse, D**-0.5 * LOG2E, fp8.KV_BLOCK, k.shape[2]
            ),
            warmup=25,
            rep=150,
        )
        bf16 = do_bench(functools.partial(attention_forward, q, k, v), warmup=25, rep=150)
        tiles = math.ceil(lk / fp8_hopper.CONFIGS[D][0])
        print(
            f"Lk {lk}: quantise K/V {quant * 1e3:.1f} us, FP8 kernel {kernel:.4f} ms, bf16 forward {bf16:.4f} ms, "
            f"{tiles} key tiles a program",
            flush=True,
        )


if __name__ == "__main__":
    main()
