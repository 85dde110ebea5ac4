"""Phase autoselect -- Triton or PyTorch per operation, chosen at run time at the model's own shapes.

    python -m phases autoselect                               # seed, small, medium in bf16 on a GPU
    python -m phases autoselect --shape seed --steps 300      # the seed's small LLM, 300 steps
    python -m phases autoselect --shape large xl --dtype bf16 --steps 50

Per size: ``tritonlab.autoselect.select`` on the model's first batch with an empty cache (cold) and
again with the cache it wrote (cached); every choice re-timed independently; what selection adds to
a cold start, in fresh processes (``probe.py``: from the imports to the end of the first training
step, PyTorch's against autoselect's with an empty selection cache, after one autoselect process
that fills Triton's compile cache; 3 rounds on a GPU); then the LM trained for --steps steps three
ways from the same weights on the same batches: all PyTorch (SDPA), all Triton
(``our_components``), autoselected. The three models are built together and take turns on each
batch, the way that steps first rotating per batch, so a drift of the host's speed falls on all
three alike; where they do not fit in memory together, they train one after another (the rows'
``order``). Without a GPU only the tiny size runs (Triton's interpreter, a 512-token vocabulary,
fp32): that checks the code runs and measures nothing.
"""

import argparse

from common import ON_GPU
from common.cli import parse_phase_args, phase_parser, phase_run, refuse_bf16_on_cpu, require_at_least

from .bench import (
    BATCH_CONTEXT,
    CPU_SIZES,
    DEFAULT_BATCH_CONTEXT,
    DTYPES,
    GPU_SIZES,
    SIZES,
    Plan,
    run_size,
)
from .report import REPORT

PHASE = "autoselect"


def build_parser() -> argparse.ArgumentParser:
    parser = phase_parser(
        PHASE,
        __doc__.strip().splitlines()[0],
        shapes=list(SIZES),
        gpu_shapes=GPU_SIZES,
        cpu_shapes=CPU_SIZES,
        dtypes=list(DTYPES),
        default_dtype="bf16" if ON_GPU else "fp32",
        epilog="sizes (d_model, d_ff, layers, heads; batch x context by default):\n"
        + "\n".join(
            f"  {name:7s} ({c.d_model}, {c.d_ff}, {c.n_layers}, {c.n_heads}); "
            f"{'x'.join(map(str, BATCH_CONTEXT.get(name, DEFAULT_BATCH_CONTEXT)))}"
            for name, c in SIZES.items()
        )
        + "\n--dtype bf16 and fp16 are autocast over fp32 weights.",
    )
    parser.add_argument("--steps", type=int, default=None, help="training steps per way (default 100 on a GPU, 3 on the CPU)")  # fmt: skip
    parser.add_argument("--warmup", type=int, default=None, help="first steps left out of the mean (default 10 on a GPU, 1 on the CPU)")  # fmt: skip
    parser.add_argument("--batch", type=int, default=None, help="batch size (default: the size's)")
    parser.add_argument("--context", type=int, default=None, help="sequence length (default: the size's)")
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parse_phase_args(parser, argv)
    refuse_bf16_on_cpu(parser, args.dtype)
    args.steps = args.steps if args.steps is not None else (100 if ON_GPU else 3)
    args.warmup = args.warmup if args.warmup is not None else (10 if ON_GPU else 1)
    require_at_least(parser, args, {"steps": 1, "warmup": 0, "batch": 1, "context": 1})
    if args.warmup >= args.steps:
        parser.error(f"--warmup: {args.warmup} leaves no timed step of --steps {args.steps}")
    for size in args.shape:
        _, context = BATCH_CONTEXT.get(size, DEFAULT_BATCH_CONTEXT)
        most = SIZES[size].context_length
        if (args.context or context) > most:
            parser.error(f"--context {args.context}: beyond the {size} model's maximum of {most}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    with phase_run(PHASE, REPORT, no_report=args.no_report) as writer:
        for size in args.shape:
            batch, context = BATCH_CONTEXT.get(size, DEFAULT_BATCH_CONTEXT)
            plan = Plan(
                size, args.dtype, args.batch or batch, args.context or context, args.steps, args.warmup
            )
            print(f"{size}: {plan.cfg.label()}; batch {plan.batch} x context {plan.context}; {args.dtype}; "
                  f"{plan.steps} steps")  # fmt: skip
            run_size(plan, lambda row: _print(writer.write(row)))


def _print(row: dict) -> dict:
    v = row.get("variant", "")
    if row.get("status") != "ok":
        print(f"  {v}: {row.get('status')}: {row.get('error', '')}")
    elif v.startswith("select"):
        print(f"  {v}: {row['startup_s']:.3f} s, {row['ops_triton']} of {row['ops_selected']} on Triton")
    elif v == "cold-start":
        print(f"  cold-start: selection adds {row['select_adds_s']:.2f} s (median of {row['repeats']}: "
              f"{row['start_autoselect_s']:.2f} s with it against {row['start_pytorch_s']:.2f} s without)")  # fmt: skip
    elif v in ("pytorch", "triton", "autoselect"):
        print(f"  {v:10s} {row['mean_ms']:.3f} ms/step, {row['tokens_per_s']:,.0f} tokens/s, "
              f"final loss {row['final_loss']:.4f} ({row['order']})")  # fmt: skip
    elif v == "choice" and row.get("wrong_pick"):
        print(f"  wrong pick: {row['op']} {row['shapes']}")
    return row


if __name__ == "__main__":
    main()
