"""Two softmax warpgroups a program instead of three, for the Gluon FP8 forward (``fp8_hopper``) and
the bf16 one (``forward_hopper``): 128 query rows a program, so mid's 4 x 8 heads of 11 000 rows
make 2 752 programs (20.85 waves on 132 SMs) where 192 rows make 1 856 (14.06 waves, the last one
6% full). Each variant is the module's source with the third softmax partition taken out; timed
against the kernel as it is in alternating rounds at mid, large and mid-d128, beside SDPA cuDNN
(the FP8 cells with the K/V quantisation launch), after checking both outputs agree.

    PYTHONPATH=. python3 reports/data/05_fp8_attn/diagnostics/two_warpgroups.py [softmax registers]
"""

import functools
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from patched import load_patched  # noqa: E402


def two_warpgroups(name: str, partition: str, last_arg: str, regs: int):
    """``name``'s module with its third softmax partition taken out, ``regs`` for the other worker."""

    def edit(source: str) -> str:
        for old, new in [
            ("NUM_CONSUMERS: gl.constexpr = 3", "NUM_CONSUMERS: gl.constexpr = 2"),
            ("        [4, 4, 1],\n        [160, 160, 24],", f"        [4, 1],\n        [{regs}, 24],"),
            ("BLOCK_M = ROWS_PER_WARPGROUP * SOFTMAX_WARPGROUPS", "BLOCK_M = ROWS_PER_WARPGROUP * 2"),
        ]:
            source = source.replace(old, new)
        third = re.compile(rf"\n            \({partition}, \(q_bufs\.index\(2\).*?{last_arg}\)\),", re.DOTALL)
        source, n = third.subn("", source)
        assert n == 1, name
        return source

    return load_patched(f"{name}.py", f"{name}_two", edit)


def main():
    import torch
    from gluon_fp8_configs import cudnn, rel
    from patched import alternate, fp8_forward

    from common.attention_bench import make_inputs, tnp_case, with_head_dim
    from tritonlab.attention import forward_hopper, fp8_hopper
    from tritonlab.attention._common import LOG2E
    from tritonlab.attention.forward import _forward_outputs

    regs = int(sys.argv[1]) if len(sys.argv) > 1 else 160
    fp8_two = two_warpgroups("fp8_hopper", "_fp8_softmax_partition", "KV_BLOCK", regs)
    bf16_two = two_warpgroups("forward_hopper", "_softmax_partition", "CAUSAL", regs)

    fp8_run = fp8_forward

    def bf16_run(module, q, k, v):
        o, lse = _forward_outputs(q)
        module.forward(q, k, v, o, lse, q.shape[-1] ** -0.5 * LOG2E)
        return o

    print(f"softmax worker registers: {regs}")
    for shape, d, rounds in (("mid", 64, 4), ("large", 64, 2), ("mid", 128, 3)):
        case = with_head_dim(tnp_case(shape), d)
        q, k, v = make_inputs(case, torch.bfloat16, grad=False)[:3]
        reps = dict(warmup=25, rep=150) if shape == "mid" else dict(warmup=1, rep=5)
        ref = cudnn(q, k, v)
        for kind, run, three, two in (
            ("fp8", fp8_run, fp8_hopper, fp8_two),
            ("bf16", bf16_run, forward_hopper, bf16_two),
        ):
            a, b = run(three, q, k, v), run(two, q, k, v)
            print(
                f"{case.label} {kind}: rel err 3 warpgroups {rel(a, ref):.2e}, 2 warpgroups {rel(b, ref):.2e}",
                flush=True,
            )
            alternate(
                f"{case.label} {kind}", rounds, reps, functools.partial(cudnn, q, k, v),
                {"3 warpgroups": functools.partial(run, three, q, k, v),
                 "2 warpgroups": functools.partial(run, two, q, k, v)},
            )  # fmt: skip


if __name__ == "__main__":
    main()
