"""Phase 12 -- the TransformerNP end to end: SDPA baselines against our kernels, eager and compiled.

    python -m phases 12_matrix                                   # small (graphed too) and mid, every variant
    python -m phases 12_matrix --shape small --variants sdpa-cudnn custom-bf16-fused
    python -m phases 12_matrix --checkpoint none selective --graphs off on
    python -m phases 12_matrix --shape large --loss-steps 10     # seconds a step

Per shape, checkpoint mode, graph toggle and variant: the loss and every parameter gradient from the
seed's weights on one batch are checked against the sdpa-cudnn model (sdpa-math on the CPU) first,
then ``--loss-steps`` training steps record the loss curve, then ``--steps`` timed steps give the step
time (median, p20/p80), forward/backward/optimizer times, tokens/s, peak memory and the speedups
against sdpa-cudnn and the best baseline of the same run, then ``--profile-steps`` steps under
torch.profiler give the GPU's busy time and kernel time by family (attention, MLP, heads, loss,
cuBLAS, Inductor, ...). Without a GPU it runs the tiny shape in
Triton's interpreter (fp32), sdpa-math and the eager custom variants; the rest are "skipped" rows
naming why.
"""

from common import ON_GPU, run_cells
from common.cli import choices_argument, phase_run
from common.step import count_argument, default_graphs, parse_step_args, step_parser
from tritonlab.models import CHECKPOINT_MODES

from .bench import TOLERANCES, VARIANTS, Setup, model_config, shape_cells
from .report import REPORT

PHASE = "12_matrix"


def _tolerance_text() -> str:
    return "; ".join(
        f"{dtype}: loss within {t['loss_rtol']:g} relative, each gradient within {t['grad_rtol']:g} of its norm"
        for dtype, t in TOLERANCES.items()
    )


def parse_args(argv=None):
    parser = step_parser(
        PHASE,
        __doc__.strip().splitlines()[0],
        after=f" Correctness tolerance against the reference: {_tolerance_text()}.",
    )
    if not ON_GPU:
        parser.set_defaults(dtype="fp32")  # the interpreter's bf16 dots are wrong
    choices_argument(
        parser, "--variants", VARIANTS, "NAME", all_by_default=False,
        default_help="all but sdpa-math on a GPU; all on the CPU, where the cuDNN, flash, compiled and FP8 ones "
        "are skipped rows",
    )  # fmt: skip
    parser.add_argument(
        "--checkpoint",
        nargs="+",
        choices=list(CHECKPOINT_MODES),
        default=["none"],
        metavar="MODE",
        help=f"activation checkpointing, any of {', '.join(CHECKPOINT_MODES)} (default none)",
    )
    parser.add_argument(
        "--graphs",
        nargs="+",
        choices=["off", "on"],
        help="replay the step from one CUDA graph (tritonlab.graphs.GraphedStep): off, on or both "
        "(default: both at small, off at the other shapes; on the CPU a graphed cell is a skipped row)",
    )
    count_argument(
        parser,
        "loss_steps",
        "training steps of the recorded loss curve",
        (200, 3),
        Setup.at_large["loss_steps"],
    )
    count_argument(
        parser,
        "profile_steps",
        "steps after the timed ones under torch.profiler, for the GPU's time by kernel family (GPU only)",
        (3, 0),
        Setup.at_large["profile_steps"],
    )
    args = parse_step_args(parser, argv, {"steps": 1, "warmup": 1, "loss_steps": 0, "profile_steps": 0})
    if not ON_GPU and args.dtype == "bf16":
        parser.error("--dtype bf16: the interpreter's bf16 dots are wrong on the CPU; use fp32")
    default = [v for v in VARIANTS if v != "sdpa-math"] if ON_GPU else VARIANTS
    args.variants = list(dict.fromkeys(args.variants or default))
    args.checkpoint = list(dict.fromkeys(args.checkpoint))
    if args.graphs is not None:
        args.graphs = [g == "on" for g in dict.fromkeys(args.graphs)]
    return args


def graph_toggles(args, shape: str) -> list[bool]:
    """``--graphs`` as asked, else the shape's default (``common.step.default_graphs``)."""
    return args.graphs if args.graphs is not None else [g == "on" for g in default_graphs(shape)]


# Phase 10's main in shape (parse, Setup, a run over the shapes); what the two share is common.step's.
def main(argv=None) -> None:
    args = parse_args(argv)
    setup = Setup(
        model_config(), args.dtype, steps=args.steps, warmup=args.warmup, loss_steps=args.loss_steps,
        profile_steps=args.profile_steps,
    )  # fmt: skip
    with phase_run(PHASE, REPORT, no_report=args.no_report) as writer:
        cells = [
            cell
            for shape in args.shapes
            for cell in shape_cells(
                setup, shape, args.variants, args.checkpoint, graph_toggles(args, shape.name)
            )
        ]
        run_cells(writer, cells)


if __name__ == "__main__":
    main()
