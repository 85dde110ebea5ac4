"""Phase 01 -- the baseline: one TransformerNP training step on PyTorch SDPA, eager and compiled.

    python -m phases 01 --shape small mid               # or: just phase 01 --shape small mid
    python -m phases 01 --train                         # also a few hundred steps; the loss curve

For every shape, SDPA backend and mode (eager, torch.compile) it measures the whole step -- forward,
backward, AdamW -- with per-stage times, tokens/s and peak memory, one CSV row per cell, and then
renders the report. Everything later phases do is measured against these rows.
"""

from common import ON_GPU, run_cells
from common.cli import choices_argument, parse_phase_args, phase_parser, phase_run
from common.step import resolve_shapes
from tritonlab.models import DTYPES, SDPA_BACKENDS, SHAPES, TNPConfig, resolve_shape

from .bench import MODES, step_cells, train
from .report import REPORT

PHASE = "01_baseline"


def parse_args(argv=None):
    parser = phase_parser(
        PHASE,
        __doc__.strip().splitlines()[0],
        shapes=list(SHAPES),
        gpu_shapes=("small",),
        cpu_shapes=("tiny",),
        dtypes=list(DTYPES),
        default_dtype="bf16",
        epilog="shapes: "
        + "; ".join(f"{s.label()}" for s in SHAPES.values())
        + ". --dtype bf16 is autocast over fp32 weights.",
    )
    parser.add_argument("--batch", type=int, default=None, help="override every shape's batch size")
    parser.add_argument(
        "--steps", type=int, default=None, help="timed steps per cell (default 10; 3 at large)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="untimed steps first: compilation, autotuning (default: %(default)s)",
    )
    choices_argument(
        parser, "--sdpa-backend", list(SDPA_BACKENDS), "BACKEND", all_by_default=False,
        what="SDPA backends to pin", default_help="cudnn flash on a GPU, math on the CPU",
    )  # fmt: skip
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        default=None,
        help="eager and/or compile (default: both on a GPU, eager on the CPU)",
    )
    parser.add_argument("--train", action="store_true", help="also train and write the loss curve")
    parser.add_argument(
        "--train-steps", type=int, default=None, help="training steps (default 300; 30 on the CPU)"
    )
    args = parse_phase_args(parser, argv)
    for name in ("steps", "warmup", "train_steps", "batch"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "warmup" else 1):
            parser.error(
                f"--{name.replace('_', '-')}: must be {'>= 0' if name == 'warmup' else 'positive'}, got {value}"
            )
    args.shapes = resolve_shapes(parser, args)
    args.sdpa_backend = args.sdpa_backend or (["cudnn", "flash"] if ON_GPU else ["math"])
    args.modes = args.modes or (list(MODES) if ON_GPU else ["eager"])
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    cfg = TNPConfig()
    with phase_run(PHASE, REPORT, no_report=args.no_report) as writer:
        step_kw = {"steps": args.steps, "warmup": args.warmup}
        run_cells(writer, step_cells(cfg, args.shapes, args.modes, args.sdpa_backend, args.dtype, **step_kw))
        if args.train:
            shape = resolve_shape("small" if ON_GPU else "tiny", args.batch)
            train_steps = args.train_steps or (300 if ON_GPU else 30)
            train(writer, cfg, shape, args.sdpa_backend[0], args.dtype, train_steps)


if __name__ == "__main__":
    main()
