"""The Gluon fused backward's settings, kernel time alone (H100, bf16, the model's strided layout):
the two-pass backward against the fused one at input ring stages x dQ staging tiles a warpgroup,
at mid and large (D = 64) and mid-d128. Each cell is checked against the two-pass gradients first.

    PYTHONPATH=. python3 reports/data/04_fused_attn/diagnostics/gluon_fused_configs.py
"""

import functools

import torch
from triton.testing import do_bench

from common.attention_bench import make_inputs, tnp_case, with_head_dim
from tritonlab.attention import attention_forward, backward_hopper
from tritonlab.attention._common import backward_delta
from tritonlab.attention.backward import _key_grad_buffers, _like_q_layout, _two_pass_backward


def fused(q, k, v, o, lse, do, scale, config, dq_stages):
    B, H, Lq, D = q.shape
    delta = backward_delta(o, do)
    grads, _ = _key_grad_buffers(k, n_chunks=1)
    dq_sum = torch.zeros((B, H, Lq, D), dtype=torch.float32, device=q.device)
    backward_hopper.dkdv(q, k, v, lse, do, delta, grads, scale, config=config, dq=dq_sum, dq_stages=dq_stages)
    dq = _like_q_layout(q)
    dq.copy_(dq_sum)
    return dq, grads


def main():
    for name, d in (("mid", 64), ("large", 64), ("mid", 128)):
        case = with_head_dim(tnp_case(name), d)
        q, k, v, do = make_inputs(case, torch.bfloat16, grad=False)
        scale = d**-0.5
        o, lse = attention_forward(q, k, v)
        ref_dq, ref_kv = _two_pass_backward(q, k, v, o, lse, do, scale)
        reps = dict(warmup=25, rep=100) if name == "mid" else dict(warmup=1, rep=1)
        base = do_bench(functools.partial(_two_pass_backward, q, k, v, o, lse, do, scale), **reps)
        print(f"{case.label} two-pass backward {base:.3f} ms", flush=True)
        block_m, _, regs = backward_hopper.CONFIGS[d]
        for stages in (2, 3):
            for dq_stages in (1, 2):
                config = (block_m, stages, regs)
                try:
                    dq, kv = fused(q, k, v, o, lse, do, scale, config, dq_stages)
                    err = max(
                        ((a.float() - b.float()).norm() / b.float().norm()).item()
                        for a, b in ((dq, ref_dq), (kv, ref_kv))
                    )
                    ms = do_bench(
                        functools.partial(fused, q, k, v, o, lse, do, scale, config, dq_stages), **reps
                    )
                    print(
                        f"{case.label} fused stages={stages} dq_stages={dq_stages}: {ms:.3f} ms "
                        f"({base / ms:.3f}x two-pass), rel diff {err:.1e}",
                        flush=True,
                    )
                except Exception as exc:  # a config that does not fit is a line, not the end
                    print(
                        f"{case.label} fused stages={stages} dq_stages={dq_stages}: {type(exc).__name__} {exc}"[
                            :300
                        ]
                    )


if __name__ == "__main__":
    main()
