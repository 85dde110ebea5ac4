"""What V's block means cost the Gluon FP8 forward: ``fp8_hopper`` with the means' loads and their
multiply-add per output element taken out (a wrong result -- V8 still holds V less its means --
but the kernel's time without that work), against the kernel as it is, in alternating rounds at
mid and large, beside SDPA cuDNN; both with the K/V quantisation launch.

    PYTHONPATH=. python3 reports/data/05_fp8_attn/diagnostics/fp8_without_means.py
"""

import functools
import importlib.util
import pathlib
import sys
import tempfile

# What the variant changes in fp8_hopper.py's source: no means loaded, none added.
EDITS = [
    ("from .._launch", "from tritonlab._launch"),
    ("from .._runtime", "from tritonlab._runtime"),
    ("from ..ops import", "from tritonlab.ops import"),
    ("from .forward_hopper", "from tritonlab.attention.forward_hopper"),
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


def variant():
    source = pathlib.Path("tritonlab/attention/fp8_hopper.py").read_text()
    for old, new in EDITS:
        assert old in source, old
        source = source.replace(old, new)
    path = pathlib.Path(tempfile.mkdtemp()) / "fp8_hopper_without_means.py"
    path.write_text(source)  # Gluon reads a kernel's source from its file
    spec = importlib.util.spec_from_file_location("fp8_hopper_without_means", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    import torch
    from triton.testing import do_bench

    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from gluon_fp8_configs import cudnn

    from common.attention_bench import make_inputs, tnp_case
    from tritonlab.attention import fp8, fp8_hopper
    from tritonlab.attention._common import LOG2E
    from tritonlab.attention.forward import _forward_outputs

    without = variant()

    def run(module, q, k, v):
        k8, ks, v8t, vs, vm = fp8._quantize_kv(k, v)
        o, lse = _forward_outputs(q)
        module.forward(q, k8, ks, v8t, vs, vm, o, lse, q.shape[-1] ** -0.5 * LOG2E, fp8.KV_BLOCK, k.shape[2])
        return o

    for name, rounds in (("mid", 4), ("large", 2)):
        q, k, v = make_inputs(tnp_case(name), torch.bfloat16, grad=False)[:3]
        reps = dict(warmup=25, rep=150) if name == "mid" else dict(warmup=1, rep=5)
        for r in range(rounds):
            c = do_bench(functools.partial(cudnn, q, k, v), **reps)
            a = do_bench(functools.partial(run, fp8_hopper, q, k, v), **reps)
            b = do_bench(functools.partial(run, without, q, k, v), **reps)
            print(
                f"{name} round {r}: cudnn {c:.3f} ms, fp8_hopper {a:.3f} ({c / a:.3f}x), without means "
                f"{b:.3f} ({c / b:.3f}x); with / without {a / b:.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
