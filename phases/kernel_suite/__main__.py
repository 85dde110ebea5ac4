"""Phase kernel_suite -- tritonlab.ops against PyTorch eager, torch.compile and Liger-Kernel.

    python -m phases kernel_suite                          # or: just phase kernel_suite
    python -m phases kernel_suite --shape quick --kernels rms_norm cross_entropy
    python -m phases kernel_suite --tune                   # the launch-setting sweeps

For every op (RMSNorm, GELU, SwiGLU, RoPE, cross-entropy, FP8 quantisation row- and block-wise), size
and pass (forward, backward, forward+backward) it checks each implementation against the eager
function on fp32 inputs, then times it, turns its bytes into GB/s and a share of the copy bandwidth
measured in the same run, records the extra memory it needs, writes one CSV row per cell and
renders the report. Without a GPU it runs the interpreter on tiny odd sizes.
"""

import torch

from common import ON_GPU, run_cells
from common.cli import choices_argument, parse_phase_args, phase_parser, phase_run

from .bench import KERNELS, PASSES, SIZES, VARIANTS, cells, count_cells, tune_cells
from .report import REPORT

PHASE = "kernel_suite"


def parse_args(argv=None):
    # phase_parser's arguments, with this phase's values: every phase's call has this shape.
    parser = phase_parser(
        PHASE,
        __doc__.strip().splitlines()[0],
        shapes=list(SIZES),
        gpu_shapes=("full",),
        cpu_shapes=("tiny",),
        dtypes=("bf16", "fp16", "fp32"),
        default_dtype="bf16",
        epilog="size sets (--shape): tiny = odd sizes of a few hundred elements (the interpreter's), "
        "quick = two LLM sizes per op, full = every size (4096x1024 up to 65536x8192; cross-entropy "
        "up to 16384x128256)",
    )
    choices_argument(parser, "--kernels", KERNELS, "KERNEL")
    choices_argument(
        parser, "--variants", VARIANTS, "VARIANT", all_by_default=False,
        default_help="all on a GPU; ours and eager on the CPU",
    )  # fmt: skip
    choices_argument(
        parser, "--passes", PASSES, "PASS",
        default_help="all; cross-entropy has fwd+bwd only, FP8 fwd only",
    )  # fmt: skip
    parser.add_argument(
        "--tune",
        action="store_true",
        help="instead of the benchmark, sweep cross-entropy's and RMSNorm backward's launch settings, "
        "those of --kernels (rows to data/kernel_suite/tune/; tiny sizes on the CPU)",
    )
    args = parse_phase_args(parser, argv)
    args.variants = args.variants or (list(VARIANTS) if ON_GPU else ["ours", "eager"])
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.manual_seed(0)
    short = not ON_GPU or args.shape == ["tiny"] or "quick" in args.shape or args.tune
    bench_kw = {"warmup_ms": 50.0, "rep_ms": 200.0} if short else {}
    if args.tune:  # the sweep's rows go to tune/, and no report reads them
        with phase_run(PHASE, subdir="tune") as writer:
            run_cells(writer, tune_cells(args.dtype, bench_kw, args.kernels))
        return
    with phase_run(PHASE, REPORT, no_report=args.no_report) as writer:
        total = count_cells(args.kernels, args.variants, args.passes, args.shape)
        run_cells(
            writer,
            cells(args.kernels, args.variants, args.passes, args.shape, args.dtype, bench_kw),
            total=total,
        )


if __name__ == "__main__":
    main()
