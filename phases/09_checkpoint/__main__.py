"""Phase 09 -- activation checkpointing of the TransformerNP's blocks: does the larger batch it allows pay for its recompute?

    python -m phases 09 --shape small mid                # or: just phase 09 --shape small mid
    python -m phases 09 --shape large --no-search        # the shape's batch only: each step takes seconds

Checkpointing keeps less of each block's activations for the backward and recomputes the rest, so
a step costs more but a larger batch fits; the spec keeps it only if that larger batch's tokens/s
beats the best tokens/s without it. For every shape and checkpoint mode (``--checkpoint``: none,
block, selective, mlp -- ``tritonlab.models.CHECKPOINT_MODES`` says what each recomputes) it
measures the whole training step (forward, backward, AdamW): median step time, tokens/s =
B·(M+N) / step time and peak memory, first at the shape's batch, then at every batch a search for
the largest batch that fits tries (doubling from the shape's batch up to ``--max-batch``, then
bisection to within 1/8; every out-of-memory probe is a row with status "oom", never a crash). The
report opens with a verdict per shape: best tokens/s with checkpointing over best tokens/s without.
"""

from common import ON_GPU
from common.cli import phase_run
from common.step import parse_step_args, step_parser
from tritonlab.models import CHECKPOINT_MODES

from .bench import ATTENTIONS, CPU_CAP, GPU_CAP_FACTOR, Setup, model_config, run_phase
from .report import REPORT

PHASE = "09_checkpoint"


def parse_args(argv=None):
    parser = step_parser(
        PHASE,
        __doc__.strip().splitlines()[0],
        steps=(10, 2),
        warmup=(2, 1),
        before="checkpoint modes:\n"
        + "\n".join(f"  {name:10s} {what}" for name, what in CHECKPOINT_MODES.items())
        + "\n",
    )
    parser.add_argument(
        "--checkpoint",
        nargs="+",
        choices=list(CHECKPOINT_MODES),
        default=list(CHECKPOINT_MODES),
        metavar="MODE",
        help=f"checkpoint modes to measure, any of {', '.join(CHECKPOINT_MODES)} (default: all)",
    )
    parser.add_argument(
        "--attention",
        choices=list(ATTENTIONS),
        default=None,
        help="the attention component: SDPA pinned to one backend, or the library's Triton kernels "
        "(default: sdpa-cudnn on a GPU, sdpa-math on the CPU)",
    )
    parser.add_argument(
        "--compile", action="store_true", help="torch.compile the model's loss (static, per cell)"
    )
    search = parser.add_argument_group("the search for the largest batch that fits")
    search.add_argument(
        "--no-search", action="store_true", help="measure the shape's batch only; search nothing"
    )
    search.add_argument(
        "--max-batch",
        type=int,
        default=None,
        help=f"the search's ceiling (default: {GPU_CAP_FACTOR}x the shape's batch on a GPU, "
        f"{CPU_CAP} on the CPU)",
    )
    search.add_argument(
        "--search-steps",
        type=int,
        default=3 if ON_GPU else 1,
        help="timed steps per probe (default 3; 1 on the CPU)",
    )
    search.add_argument(
        "--search-warmup",
        type=int,
        default=1,
        help="untimed steps per probe; one puts AdamW's state in the peak (default: %(default)s)",
    )
    args = parse_step_args(
        parser, argv, {"steps": 1, "warmup": 0, "max_batch": 1, "search_steps": 1, "search_warmup": 0}
    )
    if not ON_GPU and args.max_batch is not None and args.max_batch > 4 * CPU_CAP:
        parser.error(f"--max-batch {args.max_batch}: at most {4 * CPU_CAP} in the CPU's interpreter")
    args.attention = args.attention or ("sdpa-cudnn" if ON_GPU else "sdpa-math")
    if not ON_GPU and args.attention.startswith("triton") and args.dtype == "bf16":
        parser.error(
            "--dtype bf16: the interpreter's bf16 dots are wrong on the CPU; use fp32 with Triton attention"
        )
    args.checkpoint = list(dict.fromkeys(args.checkpoint))  # each mode once, in the order given
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    setup = Setup(
        model_config(),
        args.attention,
        args.dtype,
        compile_model=args.compile,
        steps=args.steps,
        warmup=args.warmup,
        search_steps=args.search_steps,
        search_warmup=args.search_warmup,
    )
    with phase_run(PHASE, REPORT, no_report=args.no_report) as writer:
        run_phase(
            writer, setup, args.shapes, args.checkpoint, search=not args.no_search, max_batch=args.max_batch
        )


if __name__ == "__main__":
    main()
