"""Phase 07 -- the 10 GMM heads as one grouped kernel, against the loop over heads, bmm and compile.

    python -m phases 07 --shape small mid large      # or: just phase 07 --shape mid

At each TransformerNP shape's target count (B·N rows of z, d_model 512, 10 heads of 512 -> 1365 -> 3)
it checks and times every variant's forward, backward and forward+backward side by side (see
``bench.py`` for the variants), writes one row per cell and renders the report. Without a GPU it
runs the tiny shape with small dims in Triton's interpreter: the code runs, nothing is measured.
"""

from common import run_cells
from common.cli import parse_phase_args, phase_run, refuse_bf16_on_cpu
from common.fwd_bwd import fwd_bwd_parser
from tritonlab.testing import DTYPES

from .bench import VARIANTS, cells
from .report import REPORT

PHASE = "07_grouped_gemm"


# The same script as phase 06's, on this phase's bench (shared: common.fwd_bwd, common.cli).
def parse_args(argv=None):
    parser = fwd_bwd_parser(
        PHASE, __doc__.strip().splitlines()[0], VARIANTS, dtypes=tuple(DTYPES),
        epilog="variants: " + ", ".join(VARIANTS),
    )  # fmt: skip
    args = parse_phase_args(parser, argv)
    refuse_bf16_on_cpu(parser, args.dtype)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    with phase_run(PHASE, REPORT, no_report=args.no_report) as writer:
        total = len(args.shape) * len(args.variants)
        run_cells(writer, cells(args.shape, args.variants, DTYPES[args.dtype]), total=total)


if __name__ == "__main__":
    main()
