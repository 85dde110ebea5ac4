"""Phase 04 -- the fused attention backward, against the two-pass backward, SDPA cuDNN and SDPA flash.

    python -m phases 04                              # small, mid, large (tiny on the CPU)
    python -m phases 04 --shape mid --sweep          # and the Lk sweep, Lq = 1.1 Lk
    python -m phases 04 --two-pass-on small          # phase 03's backward (and the deterministic
                                                     # fused one) side by side only at small
    python -m phases 04 --graphed-on small mid       # also time CUDA-graph replays there

``tritonlab.attention.fused_attention`` runs phase 02's forward and a fused backward. On Hopper,
where the Gluon kernels run, that is one pass over the score tiles: a program owns a key block,
keeps its dK and dV on chip and adds each query tile's share of dQ into a float32 buffer with TMA
reductions (variant `triton-fused`; the sum's order varies). ``deterministic=True`` (variant
`triton-fused-det`, and every call elsewhere) is a backward of one launch without atomics: key
programs accumulate dK, dV and query programs accumulate dQ side by side in the same grid, each
computing Δ = rowsum(dO ∘ O) on chip. Each row records the config (for the Triton kernel the
autotuned one and the compiler's report: registers per thread, spilled bytes). Timings are forward + backward, checked against SDPA first. On the
shapes named by --graphed-on (small by default on a GPU: its calls are bound by the host) every
implementation is also timed as a CUDA-graph replay of the same call (mode `fwd+bwd graphed`).
"""

from common import ON_GPU, run_cells
from common.attention_bench import TNP_SHAPES, attention_parser, cases_from
from common.cli import parse_phase_args, phase_run

from .bench import cells
from .report import REPORT

PHASE = "04_fused_attn"


def parse_args(argv=None):
    parser = attention_parser(PHASE, __doc__.strip().splitlines()[0])
    parser.add_argument(
        "--two-pass-on", nargs="*", choices=TNP_SHAPES, default=None, metavar="SHAPE",
        help="the TNP shapes where phase 03's two-pass backward and the deterministic fused backward "
        "run side by side (default: every "
        "--shape; none when given without a shape). At large its autotuning alone takes about half a "
        "minute of device time",
    )  # fmt: skip
    parser.add_argument(
        "--graphed-on", nargs="*", choices=TNP_SHAPES, default=["small"] if ON_GPU else [], metavar="SHAPE",
        help="the TNP shapes also timed as CUDA-graph replays (default: small on a GPU, none on the CPU, "
        "where there are no CUDA graphs)",
    )  # fmt: skip
    args = parse_phase_args(parser, argv)
    if not ON_GPU and args.graphed_on:
        parser.error("--graphed-on: CUDA graphs need a CUDA GPU")
    args.cases = cases_from(parser, args)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    with phase_run(PHASE, REPORT, no_report=args.no_report) as writer:
        phase_cells, total = cells(args.cases, args.dtype, args.two_pass_on, args.graphed_on)
        run_cells(writer, phase_cells, total=total)


if __name__ == "__main__":
    main()
