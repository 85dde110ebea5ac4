"""Phase 08 -- the GMM negative log-likelihood in one kernel each way, against eager, compile and a copy.

    python -m phases 08 --shape small mid large            # or: just phase 08 --shape mid
    python -m phases 08 --rows 1048576 4194304             # add a bandwidth sweep
    python -m phases 08 --graphed-on small                 # graph replays on these cells only

At each TransformerNP shape's target count (B·N rows of (10, 3) mixture parameters) and at any extra
``--rows``, it checks and times every variant (see ``bench.py``) through autograd and, on the cells
``--graphed-on`` names (default: all of them on a GPU; none on the CPU, which has no CUDA graphs),
as CUDA-graph replays; writes one row per cell and renders the report. Without a GPU it runs the
tiny shape in Triton's interpreter: the code runs, nothing is measured.
"""

from common import ON_GPU, run_cells
from common.cli import parse_phase_args, phase_run
from common.fwd_bwd import fwd_bwd_parser
from tritonlab.testing import DTYPES

from .bench import VARIANTS, cells, row_counts
from .report import REPORT

PHASE = "08_gmm_logprob"
CPU_MAX_ROWS = 10_000  # what the interpreter runs in seconds


def parse_args(argv=None):
    parser = fwd_bwd_parser(
        PHASE, __doc__.strip().splitlines()[0], VARIANTS, dtypes=("bf16", "fp32"),
        epilog="fp16 params are refused: their gradients overflow at 65 504",
    )  # fmt: skip
    parser.add_argument(
        "--rows", nargs="+", type=int, default=[], metavar="T", help="extra target counts, a bandwidth sweep"
    )
    parser.add_argument(
        "--graphed-on",
        nargs="*",
        default=None,
        metavar="CELL",
        help="cells (e.g. small, T=1048576) also timed as CUDA-graph replays "
        "(default: every cell on a GPU, none on the CPU; the flag alone: none)",
    )
    args = parse_phase_args(parser, argv)
    for rows in args.rows:
        if rows < 1:
            parser.error(f"--rows: must be positive, got {rows}")
    if not ON_GPU and any(rows > CPU_MAX_ROWS for rows in args.rows):
        parser.error(
            f"--rows: more than {CPU_MAX_ROWS} is too big for Triton's interpreter without a CUDA GPU"
        )
    args.cells = row_counts(args.shape, args.rows)
    names = [name for name, _ in args.cells]
    if args.graphed_on is None:
        args.graphed_on = names if ON_GPU else []
    elif args.graphed_on and not ON_GPU:
        parser.error("--graphed-on: CUDA-graph replays need a CUDA GPU, and this machine has none")
    for name in args.graphed_on:
        if name not in names:
            parser.error(
                f"--graphed-on: {name!r} is not a cell of this run; expected any of {', '.join(names)}"
            )
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    with phase_run(PHASE, REPORT, no_report=args.no_report) as writer:
        total = sum(len(args.variants) * (2 if name in args.graphed_on else 1) for name, _ in args.cells)
        run_cells(writer, cells(args.cells, args.variants, DTYPES[args.dtype], args.graphed_on), total=total)


if __name__ == "__main__":
    main()
