"""Whether the model's strided layouts cost our attention time: the fused backward (and the
forward) on q, k, v, dO as the TransformerNP makes them -- q and dO (B, H, L, D) views of (B, L, H·D)
rows, k and v of one packed (B, M, 2, H, D) projection -- against contiguous (B, H, L, D) copies of
the same values, and with only q and dO copied (what the backward streams once per key block).
Alternating rounds in one process, CUDA-event medians; mid, then large.

    PYTHONPATH=. python3 reports/data/04_fused_attn/diagnostics/layout_ab.py [mid] [large]
"""

import statistics
import sys

import torch

from common.attention_bench import make_inputs, tnp_case
from tritonlab.attention import fused
from tritonlab.attention.backward import _checked_forward

SCALE = 0.125  # 1/sqrt(64)


def event_ms(fn, calls: int) -> float:
    """Median over ``calls`` of one call's CUDA-event time."""
    times = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def compare(name: str) -> None:
    q, k, v, do = make_inputs(tnp_case(name), torch.bfloat16, grad=False)
    layouts = {
        "model": (q, k, v, do),
        "contiguous": tuple(t.contiguous() for t in (q, k, v, do)),
        "q,dO contiguous": (q.contiguous(), k, v, do.contiguous()),
    }
    calls, rounds = (20, 4) if name == "mid" else (2, 2)
    print(f"# {torch.cuda.get_device_name()}, {name}: q {tuple(q.shape)}, k {tuple(k.shape)}", flush=True)
    for r in range(rounds):
        line = []
        for label, (lq, lk, lv, ldo) in layouts.items():
            o, lse = _checked_forward(lq, lk, lv, SCALE)
            fwd = event_ms(lambda a=lq, b=lk, c=lv: _checked_forward(a, b, c, SCALE), calls)
            bwd = event_ms(
                lambda a=lq, b=lk, c=lv, oo=o, ll=lse, d=ldo: fused._fused_backward(
                    a, b, c, oo, ll, d, SCALE
                ),
                calls,
            )
            line.append(f"{label}: fwd {fwd:8.3f} bwd {bwd:8.3f}")
        print(f"{name} round {r}: " + " | ".join(line) + " ms", flush=True)
    copies = event_ms(lambda: (q.contiguous(), do.contiguous()), calls)
    print(f"{name}: copying q and dO to contiguous {copies:.3f} ms", flush=True)


def main() -> None:
    for name in sys.argv[1:] or ["mid", "large"]:
        compare(name)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
