import torch
from torch.profiler import ProfilerActivity, profile

from tritonlab.attention import attention
from tritonlab.attention import backward as bw
from tritonlab.attention import backward_hopper as bh
from tritonlab.testing import model_qkv

B, H, Lq, Lk = 4, 8, 11000, 10000
q, k, v = model_qkv(B, H, Lq, Lk, 64, dtype=torch.bfloat16, device="cuda")
q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
do = torch.randn_like(q)


def run(gluon, cfg=None):
    orig = bw._uses_gluon
    if not gluon:
        bw._uses_gluon = lambda *a: False
    if cfg:
        bh.CONFIGS[64] = cfg
        bh._LAUNCHES.clear()
    try:
        for _ in range(3):
            attention(q, k, v).backward(do)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                attention(q, k, v).backward(do)
            torch.cuda.synchronize()
    finally:
        bw._uses_gluon = orig
    ev = {}
    for e in prof.key_averages():
        if e.device_time_total > 0:
            ev[e.key[:60]] = e.device_time_total / e.count / 1000
    print(
        f"prof gluon={gluon} cfg={cfg}: "
        + "; ".join(f"{k_}={ms:.3f}ms" for k_, ms in sorted(ev.items(), key=lambda x: -x[1])[:6]),
        flush=True,
    )


run(False)
for cfg in [(64, 2)]:
    run(True, cfg)
