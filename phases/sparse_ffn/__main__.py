"""Phase sparse_ffn -- a fixed-slice FFN backward (numerically WRONG for training) in BERT/RoBERTa.

    python -m phases sparse_ffn                           # or: just phase sparse_ffn
    python -m phases sparse_ffn --shape 32x512 --parts kernel --fractions 0 0.5 1
    python -m phases sparse_ffn --model roberta --layers 0 11 --weights /path/to/local/roberta-base

THE SLICED BACKWARD IS NUMERICALLY WRONG FOR TRAINING: dX of the FFN layers keeps the first N rows of
the flattened (batch·seq) dY only, a truncation by position, not importance. The phase measures what
such a kernel could buy: ``tritonlab.sparse_ffn.fixed_slice_matmul`` alone against torch.matmul on
the same slice and on the full dY, and forward/backward latency of a bert-base/roberta-base-sized
model (random weights from its config, or ``--weights`` from a local directory; random token ids)
with its FFN layers replaced, across N. Without a GPU: tiny dims in Triton's interpreter.
"""

import torch

from common import ON_GPU, run_cells
from common.cli import choices_argument, parse_phase_args, phase_parser, phase_run, refuse_bf16_on_cpu
from tritonlab.testing import DTYPES

from .bench import FRACTIONS, GPU_SHAPES, MODELS, PARTS, SHAPES, kernel_cells, model_cells
from .report import REPORT

PHASE = "sparse_ffn"
WARNING = (
    "WARNING: sparse_ffn's backward is numerically WRONG for training (dX truncated to the first N "
    "rows of dY by position); this phase only measures what such a kernel could buy."
)


def parse_args(argv=None):
    parser = phase_parser(
        PHASE,
        __doc__.strip().splitlines()[0],
        shapes=list(SHAPES),
        gpu_shapes=GPU_SHAPES,
        cpu_shapes=("tiny",),
        dtypes=("bf16", "fp16", "fp32"),
        default_dtype="bf16" if ON_GPU else "fp32",
        epilog="shapes (--shape): batch x sequence length; tiny = 2 x 8 with tiny dims (the interpreter's)",
    )
    parser.add_argument("--model", choices=MODELS, default="bert", help="bert-base or roberta-base sized")
    parser.add_argument(
        "--fractions", nargs="+", type=float, default=list(FRACTIONS), metavar="F",
        help="N as fractions of batch*seq rows, each in [0, 1] (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--layers", nargs="+", type=int, default=None, metavar="I",
        help="encoder layer indices to replace (default: all)",
    )  # fmt: skip
    parser.add_argument("--weights", default=None, help="a local directory for from_pretrained (no network)")
    choices_argument(parser, "--parts", PARTS, "PART")
    args = parse_phase_args(parser, argv)
    refuse_bf16_on_cpu(parser, args.dtype)
    bad = [f for f in args.fractions if not 0.0 <= f <= 1.0]
    if bad:
        parser.error(f"--fractions: each must be in [0, 1], got {bad}")
    return args


def main(argv=None) -> None:
    print(WARNING)
    args = parse_args(argv)
    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)

    def cells():
        if "kernel" in args.parts:
            yield from kernel_cells(args.shape, args.fractions, dtype)
        if "model" in args.parts:
            yield from model_cells(args.model, args.shape, args.fractions, dtype, args.layers, args.weights)

    with phase_run(PHASE, REPORT, no_report=args.no_report) as writer:
        n_kernel = 2 * 3 * len(args.fractions) if "kernel" in args.parts else 0
        n_model = 1 + len(args.fractions) if "model" in args.parts else 0
        run_cells(writer, cells(), total=len(args.shape) * (n_kernel + n_model))


if __name__ == "__main__":
    main()
