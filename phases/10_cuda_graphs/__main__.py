"""Phase 10 -- the TransformerNP's whole training step in one CUDA graph against the plain eager step.

    python -m phases 10                                    # small and mid, sdpa-cudnn and triton components
    python -m phases 10 --shape small --components triton  # or: just phase 10 --shape small
    python -m phases 10 --shape large --steps 3            # seconds a step: the graph buys little here

Per shape and components it runs the plain step (forward, backward, fused AdamW) and the same step
captured once and replayed (``tritonlab.graphs.GraphedStep``: static inputs, side-stream warm-up
that also autotunes our Triton kernels, AdamW with capturable=True). Before timing, ``--check-steps``
graphed steps from the seed's weights on one batch must match as many plain steps: bitwise where
the plain step is bitwise reproducible, else within the stated bf16 tolerance (``bench.py``). Rows:
median step time with p20/p80, tokens/s = B·(M+N) / step time, peak memory, speedup against the plain
step of the same run, and the validation's differences. Without a GPU it runs the tiny shape's plain
step in Triton's interpreter and writes the graphed cell as "skipped": the CPU has no CUDA graphs.
"""

from common import ON_GPU, run_cells
from common.cli import choices_argument, phase_run
from common.step import count_argument, parse_step_args, step_parser

from .bench import COMPONENTS, LOSS_RTOL, UPDATE_RTOL, Setup, model_config, shape_cells
from .report import REPORT

PHASE = "10_cuda_graphs"


def parse_args(argv=None):
    parser = step_parser(
        PHASE,
        __doc__.strip().splitlines()[0],
        after=" Validation tolerance where the plain step is not bitwise reproducible: each loss within "
        f"{LOSS_RTOL:g} relative, the parameters' update within {UPDATE_RTOL:g} of its norm.",
    )
    choices_argument(
        parser, "--components", list(COMPONENTS), "NAME", all_by_default=False, what="the model's components",
        default_help="sdpa-cudnn triton on a GPU, sdpa-math on the CPU; triton needs --dtype fp32 there",
    )  # fmt: skip
    count_argument(
        parser, "check_steps", "steps compared, graphed against plain, before timing", (5, 2),
        Setup.at_large["check_steps"],
    )  # fmt: skip
    args = parse_step_args(parser, argv, {"steps": 1, "warmup": 1, "check_steps": 1})
    args.components = list(
        dict.fromkeys(args.components or (["sdpa-cudnn", "triton"] if ON_GPU else ["sdpa-math"]))
    )
    if not ON_GPU and args.dtype == "bf16" and any(c.startswith("triton") for c in args.components):
        parser.error(
            "--dtype bf16: the interpreter's bf16 dots are wrong on the CPU; use fp32 with Triton components"
        )
    if not ON_GPU and any(c in ("sdpa-cudnn", "sdpa-flash") for c in args.components):
        parser.error("--components: cuDNN and flash SDPA need a CUDA GPU; use sdpa-math or triton on the CPU")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    setup = Setup(
        model_config(), args.dtype, steps=args.steps, warmup=args.warmup, check_steps=args.check_steps
    )
    with phase_run(PHASE, REPORT, no_report=args.no_report) as writer:
        cells = [
            cell for shape in args.shapes for c in args.components for cell in shape_cells(setup, shape, c)
        ]
        run_cells(writer, cells)


if __name__ == "__main__":
    main()
