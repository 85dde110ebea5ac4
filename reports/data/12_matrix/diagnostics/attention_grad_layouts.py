"""Why fused_attention's eager forward + backward on the model's layouts took longer in
attention_in_model.py than under torch.compile: the same calls with dO contiguous (B, H, L, D) or in
o's (B, L, H, D) layout (what the model's W_O backward hands over), gradients to the views or to the
projections they come from; then the kernels of one eager step (torch.profiler).

    PYTHONPATH=. python3 reports/data/12_matrix/diagnostics/attention_grad_layouts.py
"""

import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, "reports/data/12_matrix/diagnostics")
from attention_in_model import D, H, cudnn, model_layout, split  # noqa: E402

from tritonlab.attention import fused_attention  # noqa: E402
from tritonlab.models.shapes import SHAPES  # noqa: E402


def main():
    shape = SHAPES["mid"]
    B, L = shape.batch, shape.m_context + shape.n_target
    q_base, kv_base = model_layout(shape)
    do_contig = torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16)
    do_model = do_contig.transpose(1, 2).contiguous().transpose(1, 2)
    for name, fn in (("cudnn", cudnn), ("fused", fused_attention)):
        for do_name, do in (("dO contiguous", do_contig), ("dO in o's layout", do_model)):
            for target in ("bases", "views"):

                def step(fn=fn, do=do, target=target):
                    q, k, v = split(q_base, kv_base)
                    wrt = (q_base, kv_base) if target == "bases" else (q, k, v)
                    return torch.autograd.grad(fn(q, k, v), wrt, do)

                ms = do_bench(step, warmup=50, rep=300)
                print(f"  {name:6s} {do_name:17s} grads to {target:5s}: fwd+bwd {ms:.3f} ms")
    for do_name, do in (("dO contiguous", do_contig), ("dO in o's layout", do_model)):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                q, k, v = split(q_base, kv_base)
                torch.autograd.grad(fused_attention(q, k, v), (q_base, kv_base), do)
            torch.cuda.synchronize()
        print(f"\nfused, {do_name}, grads to the bases, 5 steps:")
        print(
            prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=70)
        )


if __name__ == "__main__":
    main()
