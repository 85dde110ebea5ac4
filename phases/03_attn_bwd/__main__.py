"""Phase 03 -- the attention backward in two passes, against SDPA cuDNN and SDPA flash.

    python -m phases 03                              # small, mid, large (tiny on the CPU)
    python -m phases 03 --shape mid --sweep          # and the Lk sweep, Lq = 1.1 Lk

``tritonlab.attention.attention`` is differentiable: phase 02's forward saves O and the logsumexp,
and the backward recomputes the probabilities from Q, K and that logsumexp -- never storing the
Lq x Lk matrix -- in four launches: Δ = rowsum(dO ∘ O); dK, dV by key block; the query chunks'
sum; dQ by query block. No atomics: the same inputs give the same bits. Each cell times forward +
backward (TFLOP/s count 3.5 x the forward's 4·B·H·Lq·Lk·D) after checking all four outputs
against SDPA.
"""

from common import ResultWriter, interpreter_banner, run_cells
from common.attention_bench import DTYPE_NAMES, GPU_SHAPES, TNP_SHAPES, add_case_arguments, cases_from
from common.cli import parse_phase_args, phase_parser

from .bench import cells
from .report import REPORT

PHASE = "03_attn_bwd"


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
