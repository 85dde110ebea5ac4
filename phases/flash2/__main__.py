"""Phase flash2 -- FlashAttention-2 from scratch, and the attention benchmarks around it.

    python -m phases flash2 attention-bench          # naive attention: time and memory over d x seq
    python -m phases flash2 compile-bench            # the same grid, torch.compile'd against eager
    python -m phases flash2 flash-bench              # FlashAttention-2 (Triton) vs naive and SDPA; goal shape
    python -m phases flash2 flash-bench --tune       # time candidate tiles for each kernel on one shape
    (--quick gives every part a few-minute preset; --out DIR and --no-report go before or after the part)

Read top to bottom, the story is: naive attention materialises an N x N matrix per batch element,
so its time and memory grow with N^2 (attention-bench); torch.compile fuses the softmax but keeps
the matrix (compile-bench); FlashAttention-2 never writes it, streaming K and V tiles past each
query tile with an online softmax, and recomputes it in the backward from the saved logsumexp
(tritonlab.attention.FlashAttentionPyTorch for the algorithm, FlashAttentionTriton for the kernels,
flash-bench for the numbers). Without a GPU every part runs a tiny grid (Triton's interpreter for
the kernels): it checks that the code runs and measures nothing.
"""

import argparse
import contextlib
from pathlib import Path

from common import ON_GPU, ResultWriter, interpreter_banner, run_cells
from common.cli import parse_phase_args, phase_parser, refuse_bf16_on_cpu
from tritonlab.attention import HEAD_DIMS

from .bench import (
    GOAL_SHAPE,
    QUICK,
    TUNE_CANDIDATES,
    Budget,
    compile_context,
    flash_cells,
    naive_cells,
    tune_cells,
)
from .report import REPORT

PHASE = "flash2"
PARTS = ("attention-bench", "compile-bench", "flash-bench")
DTYPE_NAMES = ("bf16", "fp16", "fp32")
NAIVE_D = (16, 32, 64, 128)
NAIVE_SEQ = (256, 1024, 4096, 8192, 16384)
FLASH_SEQ = tuple(2**p for p in range(7, 17))  # 128 ... 65 536
# --quick on a GPU: (dtype, head dims, seqs) grids that together take a couple of minutes.
FLASH_QUICK = [("bf16", (64, 128), (256, 1024, 4096, 16384)), ("fp32", (64,), (1024, 4096))]
CPU_GRID = {"naive_d": (16, 32), "naive_seq": (64, 256), "flash": [("fp32", (16,), (32, 64))]}
CPU_MAX_SEQ = 512  # the interpreter's limit


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _shared_flags() -> argparse.ArgumentParser:
    """--out and --no-report after the part too (argparse's SUPPRESS keeps the top level's values)."""
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--out", type=Path, default=argparse.SUPPRESS, help="as before the part")
    shared.add_argument(
        "--no-report", action="store_true", default=argparse.SUPPRESS, help="as before the part"
    )
    return shared


def build_parser() -> argparse.ArgumentParser:
    parser = phase_parser(
        PHASE, __doc__.strip().splitlines()[0],
        epilog="parts: " + ", ".join(PARTS) + " -- each has its own help: python -m phases flash2 PART --help",
    )  # fmt: skip
    parts = parser.add_subparsers(dest="part", metavar="PART", title="parts (one is required)")
    shared = _shared_flags()
    for name, what in (
        ("attention-bench", "naive attention"),
        ("compile-bench", "torch.compile'd naive attention against eager"),
    ):
        p = parts.add_parser(name, parents=[shared], help=f"{what}: time and memory over d x seq")
        p.add_argument(
            "--d",
            type=positive,
            nargs="+",
            default=None,
            help=f"head dims (default {' '.join(map(str, NAIVE_D))})",
        )
        p.add_argument(
            "--seq",
            type=positive,
            nargs="+",
            default=None,
            help=f"lengths (default {' '.join(map(str, NAIVE_SEQ))})",
        )
        p.add_argument(
            "--batch",
            type=positive,
            default=8,
            help="batch size (default: %(default)s; at most 2 on the CPU)",
        )
        p.add_argument(
            "--dtype", default="fp32", choices=DTYPE_NAMES, help="input dtype (default: %(default)s)"
        )
        p.add_argument(
            "--passes",
            type=positive,
            default=100,
            help="timed passes per cell after warm-up (default: %(default)s)",
        )
        p.add_argument("--quick", action="store_true", help="time budgets instead of --passes (a few reps)")
    p = parts.add_parser(
        "flash-bench", parents=[shared], help="FlashAttention-2 in Triton against naive attention and SDPA"
    )
    p.add_argument(
        "--d",
        type=positive,
        nargs="+",
        default=None,
        help=f"head dims, of {' '.join(map(str, HEAD_DIMS))} (default: all)",
    )
    p.add_argument("--seq", type=positive, nargs="+", default=None, help="lengths (default 128 ... 65536)")
    p.add_argument(
        "--dtype", nargs="+", default=None, choices=DTYPE_NAMES, help="dtypes (default: bf16 fp32)"
    )
    p.add_argument(
        "--tokens", type=positive, default=65536,
        help="tokens per batch: B = tokens // N (at least 1), so short sequences fill the GPU too (default: %(default)s)",
    )  # fmt: skip
    p.add_argument("--no-causal", action="store_true", help="non-causal attention (default causal)")
    p.add_argument(
        "--no-goal", action="store_true", help=f"skip the fixed goal shape (B, N, D) = {GOAL_SHAPE}"
    )
    p.add_argument("--quick", action="store_true", help="a smaller grid, short time budgets")
    p.add_argument("--tune", action="store_true", help="time candidate tiles per kernel instead")
    p.add_argument(
        "--tune-shape", type=positive, nargs=3, default=None, metavar=("B", "N", "D"),
        help=f"shape for --tune (default {' '.join(map(str, GOAL_SHAPE))}; 1 64 16 on the CPU)",
    )  # fmt: skip
    p.add_argument("--tune-kernels", nargs="+", default=["fwd", "dq", "dkdv"], choices=["fwd", "dq", "dkdv"])
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parse_phase_args(parser, argv)
    if args.part is None:
        parser.error(f"a part is required: one of {', '.join(PARTS)} (see python -m phases flash2 --help)")
    too_long = [s for s in (args.seq or []) if s > CPU_MAX_SEQ]
    if not ON_GPU and too_long:
        parser.error(
            f"--seq {' '.join(map(str, too_long))}: too long for Triton's interpreter on the CPU (at most {CPU_MAX_SEQ})"
        )
    if args.part == "flash-bench":
        for d in args.d or []:
            if d not in HEAD_DIMS:
                parser.error(
                    f"--d: head dim {d} is not supported by the Triton kernels; expected one of {HEAD_DIMS}"
                )
        if args.tune_shape and args.tune_shape[2] not in HEAD_DIMS:
            parser.error(f"--tune-shape: head dim {args.tune_shape[2]} is not one of {HEAD_DIMS}")
        if not ON_GPU and args.tune_shape and args.tune_shape[1] > CPU_MAX_SEQ:
            parser.error(
                f"--tune-shape: N = {args.tune_shape[1]} is too long for the interpreter (at most {CPU_MAX_SEQ})"
            )
        refuse_bf16_on_cpu(parser, *(args.dtype or []))
        if args.d or args.seq or args.dtype or not (args.quick or not ON_GPU):
            default_seq = FLASH_SEQ if ON_GPU else CPU_GRID["flash"][0][2]
            args.grids = [
                (dt, tuple(args.d or HEAD_DIMS), tuple(args.seq or default_seq))
                for dt in (args.dtype or ["bf16", "fp32"])
            ]
        else:
            args.grids = FLASH_QUICK if ON_GPU else CPU_GRID["flash"]
    else:
        refuse_bf16_on_cpu(parser, args.dtype)
    return args


def cells(args):
    budget = QUICK if args.quick or not ON_GPU else None
    if args.part in ("attention-bench", "compile-bench"):
        head_dims = args.d or (NAIVE_D if ON_GPU else CPU_GRID["naive_d"])
        seqs = args.seq or (NAIVE_SEQ if ON_GPU else CPU_GRID["naive_seq"])
        batch = args.batch if ON_GPU else min(args.batch, 2)
        print(f"{args.part}: batch {batch}, {args.dtype}, d {head_dims}, seq {seqs}")
        bench_name = args.part.removesuffix("-bench")
        grid = naive_cells(bench_name, head_dims=head_dims, seqs=seqs, batch=batch, dtype_name=args.dtype,
                           budget=budget or Budget(passes=args.passes))  # fmt: skip
        return grid, len(head_dims) * len(seqs) * 2 * (2 if bench_name == "compile" else 1)
    budget = budget or Budget(passes=None)
    causal = not args.no_causal
    if args.tune:
        shape = args.tune_shape or (GOAL_SHAPE if ON_GPU else (1, 64, 16))
        dtype = (args.dtype or ["bf16" if ON_GPU else "fp32"])[0]
        print(f"tuning tiles at B, N, D = {shape}, {dtype}, causal={causal}")
        total = sum(len(TUNE_CANDIDATES[k]) if ON_GPU else 1 for k in args.tune_kernels)
        return tune_cells(*shape, dtype, causal, budget, args.tune_kernels), total
    tokens = args.tokens if ON_GPU else min(args.tokens, 128)
    plan = [
        (max(1, tokens // n), n, d, dt, causal)
        for dt, head_dims, seqs in args.grids
        for d in head_dims
        for n in seqs
    ]
    if ON_GPU and not args.no_goal:
        plan.append((*GOAL_SHAPE, "bf16", True))  # the goal is causal
    print(f"flash-bench: {len(plan)} (B, N, D, dtype) cells, {tokens} tokens per batch, causal={causal}")

    def generate():
        for batch, n, d, dt, is_causal in plan:
            yield from flash_cells(batch, n, d, dt, is_causal, budget)

    # Implementations per cell: triton, naive and one SDPA backend on the CPU or in fp32, two otherwise.
    total = sum(3 * (3 if not ON_GPU or dt == "fp32" else 4) for *_, dt, _ in plan)
    return generate(), total


def main(argv=None) -> None:
    args = parse_args(argv)
    print(interpreter_banner())
    writer = ResultWriter(PHASE)
    grid, total = cells(args)
    with compile_context() if args.part == "compile-bench" else contextlib.nullcontext():
        rows = run_cells(writer, grid, total=total)
    print(f"rows: {writer.path} ({len(rows)} rows)")
    if not args.no_report:
        from common.report import render_phase

        print(f"report: {render_phase(REPORT)}")


if __name__ == "__main__":
    main()
