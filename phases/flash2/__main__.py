"""Phase flash2 -- FlashAttention-2 from scratch, and the attention benchmarks around it.

    python -m phases.flash2 attention-bench   # naive attention: time and memory over d x seq
    python -m phases.flash2 compile-bench     # the same grid, torch.compile'd against eager
    python -m phases.flash2 flash-bench       # FlashAttention-2 (Triton) vs naive and SDPA; goal shape
    python -m phases.flash2 flash-bench --tune   # time candidate tiles for each kernel on one shape
    (or: just phase flash2 <part> [options]; --quick gives every part a few-minute preset)

Read top to bottom, the story is: naive attention materialises an N x N matrix per batch element,
so its time and memory grow with N^2 (attention-bench); torch.compile fuses the softmax but keeps
the matrix (compile-bench); FlashAttention-2 never writes it, streaming K and V tiles past each
query tile with an online softmax, and recomputes it in the backward from the saved logsumexp
(flash_pytorch.py for the algorithm, flash_triton.py for the kernels, flash-bench for the numbers).
Without a GPU every part runs a tiny grid (Triton's interpreter for the kernels): it checks that the
code runs and measures nothing.
"""

import argparse

from common import ON_GPU, ResultWriter, interpreter_banner
from common.report import render_phase

from .bench import (
    DTYPES,
    GOAL_SHAPE,
    QUICK,
    Budget,
    attention_bench,
    compile_bench,
    flash_bench,
    goal_bench,
    tune,
)
from .flash_triton import HEAD_DIMS

PHASE = "flash2"
NAIVE_D = (16, 32, 64, 128)
NAIVE_SEQ = (256, 1024, 4096, 8192, 16384)
FLASH_SEQ = tuple(2**p for p in range(7, 17))  # 128 ... 65 536
# --quick on a GPU: (dtype, head dims, seqs) grids that together take a couple of minutes.
FLASH_QUICK = [("bf16", (64, 128), (256, 1024, 4096, 16384)), ("fp32", (64,), (1024, 4096))]
CPU_GRID = {"naive_d": (16, 32), "naive_seq": (64, 256), "flash": [("fp32", (16,), (32, 64))]}


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m phases.flash2", description=__doc__.splitlines()[0])
    parts = parser.add_subparsers(dest="part", required=True)
    for name in ("attention-bench", "compile-bench"):
        p = parts.add_parser(name, help=f"{name}: naive attention over d x seq")
        p.add_argument("--d", type=positive, nargs="+", default=None, help=f"head dims (default {NAIVE_D})")
        p.add_argument("--seq", type=positive, nargs="+", default=None, help=f"lengths (default {NAIVE_SEQ})")
        p.add_argument("--batch", type=positive, default=8)
        p.add_argument("--dtype", default="fp32", choices=DTYPES)
        p.add_argument("--passes", type=positive, default=100, help="timed passes per cell after warm-up")
        p.add_argument("--quick", action="store_true", help="time budgets instead of --passes (a few reps)")
    p = parts.add_parser("flash-bench", help="FlashAttention-2 in Triton against naive and SDPA")
    p.add_argument("--d", type=positive, nargs="+", default=None, help=f"head dims (default {HEAD_DIMS})")
    p.add_argument("--seq", type=positive, nargs="+", default=None, help="lengths (default 128 ... 65536)")
    p.add_argument("--dtype", nargs="+", default=None, choices=DTYPES, help="default bf16 fp32")
    p.add_argument(
        "--tokens",
        type=positive,
        default=65536,
        help="tokens per batch: B = tokens // N (at least 1), so short sequences fill the GPU too",
    )
    p.add_argument("--no-causal", action="store_true", help="non-causal attention (default causal)")
    p.add_argument("--no-goal", action="store_true", help=f"skip the fixed goal shape {GOAL_SHAPE}")
    p.add_argument("--quick", action="store_true", help="a smaller grid, short time budgets")
    p.add_argument("--tune", action="store_true", help="time candidate tiles per kernel instead")
    p.add_argument(
        "--tune-shape",
        type=positive,
        nargs=3,
        default=None,
        metavar=("B", "N", "D"),
        help=f"shape for --tune (default {GOAL_SHAPE})",
    )
    p.add_argument("--tune-kernels", nargs="+", default=["fwd", "dq", "dkdv"], choices=["fwd", "dq", "dkdv"])
    args = parser.parse_args(argv)

    if args.part == "flash-bench":
        for d in args.d or []:
            if d not in HEAD_DIMS:
                parser.error(
                    f"--d: head dim {d} is not supported by the Triton kernels; expected {HEAD_DIMS}"
                )
        if args.tune_shape and args.tune_shape[2] not in HEAD_DIMS:
            parser.error(f"--tune-shape: head dim {args.tune_shape[2]} is not one of {HEAD_DIMS}")
        if args.d or args.seq or args.dtype or not (args.quick or not ON_GPU):
            args.grids = [
                (dt, tuple(args.d or HEAD_DIMS), tuple(args.seq or FLASH_SEQ))
                for dt in (args.dtype or ["bf16", "fp32"])
            ]
        else:
            args.grids = FLASH_QUICK if ON_GPU else CPU_GRID["flash"]
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    print(interpreter_banner())
    writer = ResultWriter(PHASE)
    budget = QUICK if args.quick or not ON_GPU else None
    if args.part in ("attention-bench", "compile-bench"):
        budget = budget or Budget(passes=args.passes)
        head_dims = args.d or (NAIVE_D if ON_GPU else CPU_GRID["naive_d"])
        seqs = args.seq or (NAIVE_SEQ if ON_GPU else CPU_GRID["naive_seq"])
        batch = args.batch if ON_GPU else min(args.batch, 2)
        run = attention_bench if args.part == "attention-bench" else compile_bench
        print(f"{args.part}: batch {batch}, {args.dtype}, d {head_dims}, seq {seqs}")
        run(writer, head_dims=head_dims, seqs=seqs, batch=batch, dtype_name=args.dtype, budget=budget)
    elif args.tune:
        shape = args.tune_shape or (GOAL_SHAPE if ON_GPU else (1, 64, 16))
        dtype = (args.dtype or ["bf16" if ON_GPU else "fp32"])[0]
        print(f"tuning tiles at B, N, D = {shape}, {dtype}, causal={not args.no_causal}")
        tune(
            writer,
            *shape,
            dtype,
            not args.no_causal,
            budget or Budget(passes=None),
            kernels=args.tune_kernels,
        )
    else:
        budget = budget or Budget(passes=None)
        tokens = args.tokens if ON_GPU else min(args.tokens, 128)
        for dtype, head_dims, seqs in args.grids:
            print(
                f"flash-bench: {dtype}, d {head_dims}, seq {seqs}, {tokens} tokens per batch, "
                f"causal={not args.no_causal}"
            )
            flash_bench(
                writer,
                head_dims=head_dims,
                seqs=seqs,
                dtype_name=dtype,
                causal=not args.no_causal,
                budget=budget,
                tokens=tokens,
            )
        if ON_GPU and not args.no_goal:
            print(f"flash-bench: goal shape {GOAL_SHAPE}, bf16, causal, forward+backward")
            goal_bench(writer, budget)
    print(f"rows: {writer.path}")
    print(f"report: {render_phase(PHASE)}")


if __name__ == "__main__":
    main()
