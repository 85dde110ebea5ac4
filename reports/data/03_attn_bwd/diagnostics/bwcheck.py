import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from tritonlab.attention import attention
from tritonlab.attention import backward as bw
from tritonlab.testing import model_qkv, rel_err
from tritonlab.tuning import ConfigRecord

torch.manual_seed(0)
bad = 0
for B, H, Lq, Lk in [
    (1, 2, 257, 1000),
    (2, 1, 1000, 1017),
    (1, 8, 193, 1100),
    (1, 1, 1, 1000),
    (2, 3, 130, 2049),
]:
    for layout in ("model", "contig"):
        if layout == "model":
            q, k, v = model_qkv(B, H, Lq, Lk, 64, dtype=torch.bfloat16, device="cuda")
        else:
            q, k, v = (torch.randn(B, H, n, 64, device="cuda", dtype=torch.bfloat16) for n in (Lq, Lk, Lk))
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        do = torch.randn(B, H, Lq, 64, device="cuda", dtype=torch.bfloat16)
        rec = ConfigRecord()
        o = attention(q, k, v, record=rec)
        o.backward(do)
        qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
        od = torch.softmax(qd @ kd.transpose(-1, -2) * 64**-0.5, -1) @ vd
        od.backward(do.double())
        errs = [rel_err(a.grad, b.grad) for a, b in ((q, qd), (k, kd), (v, vd))] + [rel_err(o, od)]
        ok = max(errs) < 2e-2 and all(torch.isfinite(t.grad).all() for t in (q, k, v))
        bad += not ok
        print(
            f"bwcheck B{B} H{H} Lq{Lq} Lk{Lk} {layout}: dq {errs[0]:.2e} dk {errs[1]:.2e} dv {errs[2]:.2e} o {errs[3]:.2e} {'ok' if ok else 'BAD'} {rec.picked.get('dkdv')}",
            flush=True,
        )
print("bwbad", bad, flush=True)


def bench(fn):
    return triton.testing.do_bench(fn, warmup=50, rep=400)


for name, (B, H, Lq, Lk) in [("mid", (4, 8, 11000, 10000)), ("sweep30k", (7, 8, 33000, 30000))]:
    q, k, v = model_qkv(B, H, Lq, Lk, 64, dtype=torch.bfloat16, device="cuda")
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    do = torch.randn_like(q)

    def ours(q=q, k=k, v=v, do=do):
        attention(q, k, v).backward(do)

    def cudnn(q=q, k=k, v=v, do=do):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(q, k, v).backward(do)

    def triton_bwd(q=q, k=k, v=v, do=do):
        orig = bw._uses_gluon
        bw._uses_gluon = lambda *a: False
        try:
            attention(q, k, v).backward(do)
        finally:
            bw._uses_gluon = orig

    ours()
    triton_bwd()
    cudnn()
    t = {n: bench(f) for n, f in (("cudnn", cudnn), ("gluon-2pass", ours), ("triton-2pass-bwd", triton_bwd))}
    fl = 4 * B * H * Lq * Lk * 64 * 3.5
    print(
        f"bwtime {name}: "
        + " ".join(f"{n}={ms:.3f}ms({fl / ms / 1e9:.0f}TF,{t['cudnn'] / ms:.3f}x)" for n, ms in t.items()),
        flush=True,
    )
