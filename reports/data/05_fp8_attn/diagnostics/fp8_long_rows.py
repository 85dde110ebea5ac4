"""Whether the FP8 forward's error grows with the keys a row sees: on Hopper an e4m3 ``wgmma``
accumulating into an fp32 accumulator keeps only part of its mantissa (Triton's default on sm_90
never promotes the sum), and the P V product adds every key tile into the same accumulator. The
relative Frobenius error of O against float32 SDPA (memory-efficient backend), per Lk, for: the
Gluon kernel as it is, the same kernel with each tile's P V sum promoted to float32
(``max_num_imprecise_acc=BLOCK_N``: a second accumulator, hence its spills) and the Triton FP8
kernel; then each one's time at Lk = 200 000.

    PYTHONPATH=. python3 reports/data/05_fp8_attn/diagnostics/fp8_long_rows.py
"""

import functools
import pathlib
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

EDITS = [
    (
        "p_smem, v_bufs.index(prev).reshape([HEAD_DIM, BLOCK_N]).permute((1, 0)), acc, is_async=True\n",
        "p_smem, v_bufs.index(prev).reshape([HEAD_DIM, BLOCK_N]).permute((1, 0)), acc, is_async=True,\n"
        "        max_num_imprecise_acc=BLOCK_N,\n",
    ),
    (
        "acc = warpgroup_mma(p_smem, v_bufs.index(last).reshape([HEAD_DIM, BLOCK_N]).permute((1, 0)), acc)",
        "acc = warpgroup_mma(p_smem, v_bufs.index(last).reshape([HEAD_DIM, BLOCK_N]).permute((1, 0)), acc,"
        " max_num_imprecise_acc=BLOCK_N)",
    ),
]
LQ = 2048


def main() -> None:
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from gluon_fp8_configs import rel
    from patched import fp8_forward, load_patched, replace_all

    from tritonlab.attention import fp8_attention_forward, fp8_hopper

    promoted = load_patched("fp8_hopper.py", "fp8_hopper_promoted", lambda s: replace_all(s, EDITS))
    print(f"# {torch.cuda.get_device_name()}: B = 1, H·D = 512, Lq = {LQ}, unit-variance inputs", flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    for d in (64, 128):
        h = 512 // d
        for lk in (10_000, 50_000, 200_000):
            q, k, v = (torch.randn(1, h, n, d, device="cuda", generator=g) for n in (LQ, lk, lk))
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                ref = F.scaled_dot_product_attention(q, k, v)
            qb, kb, vb = (t.bfloat16() for t in (q, k, v))
            calls = {
                "gluon": functools.partial(fp8_forward, fp8_hopper, qb, kb, vb),
                "gluon promoted": functools.partial(fp8_forward, promoted, qb, kb, vb),
                "triton": lambda a=qb, b=kb, c=vb: fp8_attention_forward(
                    a, b, c, impl="triton", force_fp8=True
                )[0],
            }
            errors = "  ".join(f"{name} {rel(call(), ref):.4f}" for name, call in calls.items())
            line = f"D {d:3d} Lk {lk:7d}: error of O {errors}"
            if lk == 200_000:
                times = "  ".join(
                    f"{name} {do_bench(call, warmup=5, rep=40):.3f}" for name, call in calls.items()
                )
                line += f"   ms {times}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
