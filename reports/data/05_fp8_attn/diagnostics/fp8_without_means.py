"""What V's block means cost the Gluon FP8 forward: ``fp8_hopper`` with the means' loads and their
multiply-add per output element taken out (a wrong result -- V8 still holds V less its means --
but the kernel's time without that work), against the kernel as it is, in alternating rounds at
mid and large, beside SDPA cuDNN; both with the K/V quantisation launch.

    PYTHONPATH=. python3 reports/data/05_fp8_attn/diagnostics/fp8_without_means.py
"""

import functools
import pathlib
import sys

# What the variant changes in fp8_hopper.py's source: no means loaded, none added.
EDITS = [
    (
        "return gl.load(KS + blk), gl.load(VS + blk), gl.load(VM + blk * mean_cols.shape[0] + mean_cols)",
        "return gl.load(KS + blk), gl.load(VS + blk), 0.0",
    ),
    ("acc = acc * rescale[:, None] + mean_weight[:, None] * v_mean[None, :]", "acc = acc * rescale[:, None]"),
    ("    mean_weight = gl.convert_layout(p_sum * (1.0 / v_scale), o_rows)\n", ""),
    (
        "acc = gl.convert_layout(l_i * (1.0 / v_scale), o_rows)[:, None] * v_mean[None, :]",
        "acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)",
    ),
]


def main():
    import torch

    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from gluon_fp8_configs import cudnn
    from patched import alternate, fp8_forward, load_patched, replace_all

    from common.attention_bench import make_inputs, tnp_case
    from tritonlab.attention import fp8_hopper

    without = load_patched("fp8_hopper.py", "fp8_hopper_without_means", lambda s: replace_all(s, EDITS))
    run = fp8_forward

    for name, rounds in (("mid", 4), ("large", 2)):
        q, k, v = make_inputs(tnp_case(name), torch.bfloat16, grad=False)[:3]
        reps = dict(warmup=25, rep=150) if name == "mid" else dict(warmup=1, rep=5)
        alternate(
            name, rounds, reps, functools.partial(cudnn, q, k, v),
            {"fp8_hopper": functools.partial(run, fp8_hopper, q, k, v),
             "without means": functools.partial(run, without, q, k, v)},
        )  # fmt: skip


if __name__ == "__main__":
    main()
