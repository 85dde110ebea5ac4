"""Phase kernel_suite -- Triton training primitives against eager, torch.compile and Liger-Kernel.

    python -m phases.kernel_suite                       # or: just phase kernel_suite
    python -m phases.kernel_suite --quick --kernels rms_norm cross_entropy

For every kernel (RMSNorm, GELU, SwiGLU, RoPE, cross-entropy, FP8 quantisation row- and block-wise),
LLM-sized shapes and pass (forward, backward, forward+backward), it checks each implementation
against the eager function on fp32 inputs, then times it, turns its bytes into GB/s and a share of
the copy bandwidth measured in the same run, records the extra memory it needs, writes one CSV row per
cell and re-renders reports/kernel_suite.md. Without a GPU it runs the interpreter on tiny shapes.
"""

import argparse

import torch

import common
from common import ResultWriter, interpreter_banner
from common.report import render_phase

from .bench import DTYPES, KERNELS, PASSES, VARIANTS, run

PHASE = "kernel_suite"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m phases.kernel_suite", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), help=f"any of {', '.join(KERNELS)}")
    parser.add_argument(
        "--variants",
        nargs="+",
        default=None,
        help=f"any of {', '.join(VARIANTS)} (default: all on a GPU; ours and eager on the CPU)",
    )
    parser.add_argument("--passes", nargs="+", default=list(PASSES), help=f"any of {', '.join(PASSES)}")
    parser.add_argument("--quick", action="store_true", help="two shapes per kernel and shorter timing")
    parser.add_argument("--dtype", default="bf16", choices=DTYPES)
    args = parser.parse_args(argv)
    for name, given, allowed in (
        ("kernels", args.kernels, KERNELS),
        ("passes", args.passes, PASSES),
        ("variants", args.variants or [], VARIANTS),
    ):
        for value in given:
            if value not in allowed:
                parser.error(f"--{name}: unknown {value!r}; expected any of {', '.join(allowed)}")
    args.variants = args.variants or (list(VARIANTS) if common.ON_GPU else ["ours", "eager"])
    args.size = ("quick" if args.quick else "full") if common.ON_GPU else "cpu"
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    print(interpreter_banner())
    torch.manual_seed(0)
    bench_kw = {"warmup_ms": 50.0, "rep_ms": 200.0} if args.quick or not common.ON_GPU else {}
    writer = ResultWriter(PHASE)
    run(args.kernels, args.variants, args.passes, args.size, writer, args.dtype, bench_kw)
    print(f"rows: {writer.path}")
    print(f"report: {render_phase(PHASE)}")


if __name__ == "__main__":
    main()
