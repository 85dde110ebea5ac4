"""Phase 05 -- FP8 (e4m3) attention, against our bf16 attention, SDPA cuDNN and SDPA flash.

    python -m phases 05                              # small, mid, large (tiny on the CPU), both modes
    python -m phases 05 --shape mid --mode fwd       # the forward alone
    python -m phases 05 --shape mid --sweep          # and the Lk sweep, Lq = 1.1 Lk

``tritonlab.attention.fp8_attention_forward`` quantises K and V to e4m3 per block of 128 keys in
one launch and Q per block of query rows inside the forward, then runs both products of the online
softmax on Hopper's FP8 tensor cores with fp32 accumulation (a warp-specialised Gluon kernel on
Hopper, the Triton kernel as ``triton-fp8-tl``); ``fp8_attention`` adds a bf16 backward (phase 04's
fused one on Hopper). Mode ``fwd`` times the forward (quantisation included) beside our bf16 forward
and SDPA's; mode ``fwd+bwd`` times forward + backward beside our bf16 ``attention`` and SDPA's.
Every row records its error against SDPA, so the FP8 rows beside the bf16 rows give the accuracy
FP8 costs per shape; correctness is checked before timing.
"""

from common import run_cells
from common.attention_bench import GPU_SHAPES, TNP_SHAPES, add_case_arguments, parse_attention_args
from common.cli import choices_argument, phase_parser, phase_run

from .bench import MODES, cells
from .report import REPORT

PHASE = "05_fp8_attn"


def parse_args(argv=None):
    parser = phase_parser(
        PHASE, __doc__.strip().splitlines()[0], shapes=TNP_SHAPES, gpu_shapes=GPU_SHAPES,
        dtypes=("bf16", "fp16"),
        epilog="dtype default: bf16 on a GPU, fp16 on the CPU (the interpreter's bf16 dots are wrong); "
        "FP8 attention takes bf16 or fp16 inputs",
    )  # fmt: skip
    add_case_arguments(parser)
    choices_argument(parser, "--mode", MODES, "MODE", what="what each cell times")
    return parse_attention_args(parser, argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    with phase_run(PHASE, REPORT, no_report=args.no_report) as writer:
        phase_cells, total = cells(args.cases, args.dtype, args.mode)
        run_cells(writer, phase_cells, total=total)


if __name__ == "__main__":
    main()
