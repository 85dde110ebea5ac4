"""Phase 06 -- the fused MLP y = silu(x W1ᵀ) W2ᵀ (forward in one Triton kernel) against eager and compile.

    python -m phases 06 --shape small mid large      # or: just phase 06 --shape mid

At the MLP's token count of each TransformerNP shape (B·(M+N) tokens, d_model 512, d_ff 1365) it
checks and times every variant's forward, backward and forward+backward side by side (see
``bench.py`` for the variants), writes one row per cell and renders the report. Without a GPU it
runs the tiny shape with small dims in Triton's interpreter: the code runs, nothing is measured.
"""

from common import ON_GPU, ResultWriter, interpreter_banner, run_cells
from common.cli import parse_phase_args, phase_parser
from tritonlab.testing import DTYPES

from .bench import VARIANTS, cells
from .report import REPORT

PHASE = "06_fused_mlp"


def parse_args(argv=None):
    parser = phase_parser(
        PHASE,
        __doc__.strip().splitlines()[0],
        shapes=("tiny", "small", "mid", "large"),
        gpu_shapes=("small", "mid", "large"),
        dtypes=tuple(DTYPES),
        default_dtype="bf16" if ON_GPU else "fp32",
        epilog="variants: " + ", ".join(VARIANTS),
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANTS,
        default=list(VARIANTS),
        metavar="VARIANT",
        help=f"any of {', '.join(VARIANTS)} (default: all)",
    )
    args = parse_phase_args(parser, argv)
    if not ON_GPU and args.dtype == "bf16":
        parser.error(
            "--dtype bf16: Triton's interpreter computes bf16 dots wrongly; use fp16 or fp32 on the CPU"
        )
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    print(interpreter_banner())
    writer = ResultWriter(PHASE)
    run_cells(
        writer,
        cells(args.shape, args.variants, DTYPES[args.dtype]),
        total=len(args.shape) * len(args.variants),
    )
    print(f"rows: {writer.path}")
    if not args.no_report:
        from common.report import render_phase

        print(f"report: {render_phase(REPORT)}")


if __name__ == "__main__":
    main()
