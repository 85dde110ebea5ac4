"""Phase 02 -- the attention forward in Triton, against SDPA cuDNN and SDPA flash.

    python -m phases 02                              # small, mid, large (tiny on the CPU)
    python -m phases 02 --shape mid --sweep          # and the Lk sweep, Lq = 1.1 Lk

The TransformerNP's attention is rectangular: Lq = M+N queries over Lk = M context keys, no mask.
``tritonlab.attention.attention_forward`` computes it with one program per block of query rows
that streams K and V through an online softmax. ``triton`` lets the autotuner choose tiles and the
tile loader (TMA tensor descriptors or block pointers); ``triton-blockptr`` pins block pointers.
Every cell is checked against SDPA before it is timed; each row records the chosen config.
"""

from common import ResultWriter, interpreter_banner, run_cells
from common.attention_bench import DTYPE_NAMES, GPU_SHAPES, TNP_SHAPES, add_case_arguments, cases_from
from common.cli import parse_phase_args, phase_parser

from .bench import cells
from .report import REPORT

PHASE = "02_attn_fwd"


def parse_args(argv=None):
    parser = phase_parser(
        PHASE, __doc__.strip().splitlines()[0], shapes=TNP_SHAPES, gpu_shapes=GPU_SHAPES, dtypes=DTYPE_NAMES,
        epilog="dtype default: bf16 on a GPU, fp16 on the CPU (the interpreter's bf16 dots are wrong)",
    )  # fmt: skip
    add_case_arguments(parser)
    args = parse_phase_args(parser, argv)
    args.cases = cases_from(parser, args)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    print(interpreter_banner())
    writer = ResultWriter(PHASE)
    phase_cells, total = cells(args.cases, args.dtype)
    run_cells(writer, phase_cells, total=total)
    print(f"rows: {writer.path}")
    if not args.no_report:
        from common.report import render_phase

        print(f"report: {render_phase(REPORT)}")


if __name__ == "__main__":
    main()
