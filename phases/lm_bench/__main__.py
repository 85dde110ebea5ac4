"""Phase lm_bench -- a Transformer LM of five sizes, timed end to end, and then on our kernels.

    python -m phases lm_bench                     # = timing: every size x context x mode x dtype
    python -m phases lm_bench timing --size small medium --context 128 512 --mode train --dtype bf16
    python -m phases lm_bench warmup              # 0, 1, 2 and 5 warm-up steps, per-step times kept
    python -m phases lm_bench precision           # fp32/fp16 accumulation; dtypes under bf16 autocast
    python -m phases lm_bench profile             # NVTX ranges; torch.profiler's top kernels; softmax vs matmuls
    python -m phases lm_bench memory              # memory snapshots and timelines; peaks by context; a derivation
    python -m phases lm_bench compile             # torch.compile against eager: forward, backward, optimizer step
    python -m phases lm_bench ours                # our kernels against eager: loss/grads checked, then timed

The model is ``tritonlab.models.TransformerLM`` (pre-norm, RoPE, SwiGLU, untied output layer, vocab
10 000, batch 4). A timed cell runs --warmup untimed steps, then --steps timed ones, each between two
``torch.cuda.synchronize()`` calls; the row keeps mean, standard deviation and every step's time.
An out-of-memory is a row with status "oom", and the sweep goes on. Without a GPU only the tiny
size and contexts up to 64 run (Triton's interpreter for our kernels): that checks the code runs
and measures nothing; any other size is refused at once.
"""

import argparse
from collections.abc import Callable

from common import ON_GPU, run_cells
from common.cli import parse_phase_args, phase_parser, refuse_bf16_on_cpu
from tritonlab.models import LM_SIZES, lm_config, param_count

from .bench import (
    CPU_CONTEXTS,
    CPU_MAX_CONTEXT,
    CPU_SIZES,
    DTYPES,
    GPU_CONTEXTS,
    GPU_SIZES,
    MODES,
    OPTIMIZERS,
    OURS_VARIANTS,
    WARMUP_STEPS,
    accumulation_rows,
    autocast_dtype_rows,
    ours_cells,
    ours_total,
    timing_cells,
    warmup_cells,
)
from .report import REPORT
from .study import PROFILE_MODES, PROFILE_VARIANTS, compile_jobs, memory_jobs, profile_jobs, run_jobs

PHASE = "lm_bench"
PARTS = {
    "timing": "every size x context x mode x dtype: mean, std and per-step times (the default part)",
    "warmup": f"the same steps after {', '.join(map(str, WARMUP_STEPS))} warm-up steps",
    "precision": "the fp32/fp16 accumulation experiment and a toy model's dtypes under bf16 autocast",
    "profile": "NVTX ranges and torch.profiler's top kernels (forward; train step); attention's softmax vs matmuls",
    "memory": "memory-history snapshots and timeline PNGs; peak memory by context; a residual-stream size derived",
    "compile": "the model under torch.compile against eager: forward, forward-backward, train (per mode)",
    "ours": "our Triton kernels swapped in: loss and gradients checked, then timed against eager",
}
# The GPU defaults of each part: (sizes, contexts, modes, dtypes).
GPU_DEFAULTS = {
    "timing": (GPU_SIZES, GPU_CONTEXTS, MODES, ("fp32", "bf16")),
    "warmup": (("small", "medium", "large"), (256,), ("forward", "forward-backward"), ("fp32",)),
    "precision": ((), (), (), ()),
    "profile": (("small",), (512,), PROFILE_MODES, ("fp32", "bf16")),
    "memory": (("2.7B",), GPU_CONTEXTS, PROFILE_MODES, ("fp32", "bf16")),
    "compile": (GPU_SIZES, GPU_CONTEXTS, MODES, ("bf16",)),
    "ours": (("small", "medium", "large", "xl", "2.7B"), GPU_CONTEXTS, ("train",), ("bf16",)),
}
CPU_DEFAULTS = {
    "timing": (CPU_SIZES, CPU_CONTEXTS, MODES, ("fp32",)),
    "warmup": (CPU_SIZES, CPU_CONTEXTS, ("forward-backward",), ("fp32",)),
    "precision": ((), (), (), ()),
    "profile": (CPU_SIZES, CPU_CONTEXTS, PROFILE_MODES, ("fp32",)),
    "memory": (CPU_SIZES, CPU_CONTEXTS, PROFILE_MODES, ("fp32",)),
    "compile": (CPU_SIZES, (16,), ("forward",), ("fp32",)),
    "ours": (CPU_SIZES, CPU_CONTEXTS, ("train",), ("fp32",)),
}


def count(lo: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {value}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = phase_parser(
        PHASE,
        __doc__.strip().splitlines()[0],
        epilog="parts:\n"
        + "\n".join(f"  {name:10s} {what}" for name, what in PARTS.items())
        + "\nsizes (d_model, d_ff, layers, heads; parameters):\n"
        + "\n".join(
            f"  {name:7s} ({c.d_model}, {c.d_ff}, {c.n_layers}, {c.n_heads}); {param_count(c) / 1e6:,.1f} M"
            for name, c in LM_SIZES.items()
        )
        + "\n--dtype bf16 is autocast over fp32 weights.",
    )
    parser.add_argument(
        "part", nargs="?", choices=list(PARTS), default="timing", help="what to run (default: %(default)s)"
    )
    parser.add_argument(
        "--size",
        "--shape",
        dest="size",
        nargs="+",
        choices=list(LM_SIZES),
        default=None,
        metavar="SIZE",
        help=f"model sizes, any of {', '.join(LM_SIZES)} (default: the part's; {' '.join(CPU_SIZES)} on "
        "the CPU, where only it may run)",
    )
    parser.add_argument(
        "--context",
        nargs="+",
        type=count(1),
        default=None,
        help=f"context lengths (default: {' '.join(map(str, GPU_CONTEXTS))} on a GPU, "
        f"{' '.join(map(str, CPU_CONTEXTS))} on the CPU, at most {CPU_MAX_CONTEXT} there)",
    )
    parser.add_argument("--mode", nargs="+", choices=MODES, default=None, help="forward, forward-backward, "
                        "train (forward, backward and AdamW) (default: the part's)")  # fmt: skip
    parser.add_argument(
        "--dtype",
        nargs="+",
        choices=list(DTYPES),
        default=None,
        help="fp32, or bf16 autocast (default: the part's; fp32 on the CPU)",
    )
    parser.add_argument("--batch", type=count(1), default=4, help="batch size (default: %(default)s)")
    parser.add_argument(
        "--warmup",
        type=count(0),
        default=None,
        help="untimed steps before the timed ones (default 5 on a GPU, 1 on the CPU; the warmup part "
        f"runs {', '.join(map(str, WARMUP_STEPS))})",
    )
    parser.add_argument(
        "--steps",
        type=count(1),
        default=None,
        help="timed steps per cell (default 10 on a GPU, 2 on the CPU)",
    )
    parser.add_argument(
        "--attention",
        choices=("naive", "sdpa"),
        default="naive",
        help="PyTorch attention of timing and warmup: naive (the course's) or SDPA (default: %(default)s)",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=list(dict.fromkeys(OURS_VARIANTS + PROFILE_VARIANTS)),
        default=None,
        metavar="VARIANT",
        help=f"what ours times side by side, any of {', '.join(OURS_VARIANTS)} (default: all); what "
        f"profile traces, any of {', '.join(PROFILE_VARIANTS)} (default: eager-naive)",
    )
    parser.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        default=None,
        help="the train step's AdamW: foreach (PyTorch's default) or fused (default: fused for ours, "
        "foreach for timing and warmup)",
    )
    parser.add_argument(
        "--nvtx-attention",
        action="store_true",
        help="profile: NVTX and profiler ranges inside naive attention (scores, softmax, weighted sum)",
    )
    parser.add_argument(
        "--top", type=count(1), default=10, help="profile: kernels per table (default: %(default)s)"
    )
    parser.add_argument(
        "--snapshot-context",
        type=count(1),
        default=None,
        help="memory: the context of the memory-history snapshots (default 128 on a GPU, the first "
        "--context on the CPU)",
    )
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parse_phase_args(parser, argv)
    sizes, contexts, modes, dtypes = (GPU_DEFAULTS if ON_GPU else CPU_DEFAULTS)[args.part]
    args.size = list(dict.fromkeys(args.size or sizes))
    args.context = list(dict.fromkeys(args.context or contexts))
    args.mode = list(dict.fromkeys(args.mode or modes))
    args.dtype = list(dict.fromkeys(args.dtype or dtypes))
    args.warmup = args.warmup if args.warmup is not None else (5 if ON_GPU else 1)
    args.steps = args.steps or (10 if ON_GPU else 2)
    args.optimizer = args.optimizer or ("fused" if args.part == "ours" else "foreach")
    allowed = {"ours": OURS_VARIANTS, "profile": PROFILE_VARIANTS}.get(args.part, ())
    if args.variants and not set(args.variants) <= set(allowed):
        wrong = " ".join(v for v in args.variants if v not in allowed)
        parser.error(f"--variants {wrong}: the {args.part} part takes {', '.join(allowed) or 'no variants'}")
    args.variants = args.variants or list(allowed[:1] if args.part == "profile" else allowed)
    if not ON_GPU:
        too_big = [s for s in args.size if s not in CPU_SIZES]
        if too_big:
            parser.error(
                f"--size {' '.join(too_big)}: too big for Triton's interpreter on a machine without a CUDA "
                f"GPU; run `python -m phases {PHASE} {args.part} --size {' '.join(CPU_SIZES)}` here, or this "
                "size on a GPU"
            )
        too_long = [c for c in args.context if c > CPU_MAX_CONTEXT]
        if too_long:
            parser.error(
                f"--context {' '.join(map(str, too_long))}: too long for the CPU (at most {CPU_MAX_CONTEXT})"
            )
        if args.part == "ours":
            refuse_bf16_on_cpu(parser, *args.dtype)
    if args.snapshot_context is None:
        args.snapshot_context = 128 if ON_GPU or not args.context else args.context[0]
    elif args.part != "memory":
        parser.error(f"--snapshot-context: only the memory part takes it, not {args.part}")
    if args.part in ("profile", "memory") and set(args.mode) - set(PROFILE_MODES):
        bad = " ".join(m for m in args.mode if m not in PROFILE_MODES)
        parser.error(f"--mode {bad}: the {args.part} part takes {' or '.join(PROFILE_MODES)}")
    if args.nvtx_attention and args.part != "profile":
        parser.error(f"--nvtx-attention: only the profile part takes it, not {args.part}")
    for size in args.size:
        for context in [*args.context, *([args.snapshot_context] if args.part == "memory" else [])]:
            try:
                lm_config(size, context)
            except ValueError as err:
                parser.error(f"--context {context}: {str(err).split(': ', 1)[1]}")
    return args


def print_param_counts(sizes) -> None:
    print("parameters:")
    for name in sizes:
        cfg = LM_SIZES[name]
        print(f"  {name:7s} {param_count(cfg):>15,d}   ({cfg.label()})")


def print_step(row: dict) -> None:
    """The mean and standard deviation of a timed cell, under the runner's line."""
    if row.get("status") == "ok" and isinstance(row.get("mean_ms"), float):
        print(
            f"    {row.get('mode', '')} ctx {row.get('context', '')} warm-up {row.get('warmup', '')}: "
            f"{row['mean_ms']:.3f} ± {row['std_ms']:.3f} ms"
        )
    elif row.get("variant") == "check" and row.get("status") == "ok":
        print(f"    loss rel err {row['loss_rel_err']:.2e}, worst gradient rel err {row['grad_rel_err']:.2e}")


def _print_study(head: str, row: dict, measured: Callable[[dict], str]) -> None:
    """A profile or memory row under the runner's line: ``head``, then what it measured or, if it
    failed, its status and error."""
    text = measured(row) if row.get("status") == "ok" else f"{row['status']}: {row.get('error', '')}"
    print(f"{head} {text}")


def _profile_text(row: dict) -> str:
    if row.get("table") == "kernels":
        return (
            f"#{row['rank']:<2d} {row['total_ms']:9.3f} ms {row['share']:6.1%} x{row['calls']:<5d} "
            f"{row['kernel'][:70]}"
        )
    if row.get("table") == "total":
        return f"all kernels {row['ms_per_step']:9.3f} ms/step ({row['calls']:.0f} launches/step)"
    return f"attention {row['component']:8s} {row['total_ms']:9.3f} ms/step, {row['flops']:.3g} FLOPs"


def _memory_text(row: dict) -> str:
    if row.get("table") == "derivation":
        return (
            f"{row['tensor']}: {row['formula']} = {row['derived_bytes']:,d} B derived, "
            f"{row['measured_bytes']:,d} B measured"
        )
    if row.get("table") == "peak":
        return f"peak {row['peak_mem_gb']:.3f} GB"
    return f"snapshot {row['snapshot']}, timeline {row['timeline_png']}"


def print_profile(row: dict) -> None:
    _print_study(
        f"  {row['variant']} {row['size']} ctx {row['context']} {row['mode']} {row['dtype']}",
        row,
        _profile_text,
    )


def print_memory(row: dict) -> None:
    head = f"  {row['variant']:10s} {row['size']} ctx {row['context']} {row['mode']} {row['dtype']}"
    _print_study(head, row, _memory_text)


def main(argv=None) -> None:
    args = parse_args(argv)
    from common.cli import phase_run

    with phase_run(PHASE, REPORT, no_report=args.no_report) as writer:
        if args.part == "precision":
            for row in accumulation_rows():
                print(f"  accumulate 0.01 x 1000, {row['variant']:26s} -> {row['value']:.6f}")
                writer.write({"shape": "scalar", "part": "precision", **row})
            for row in autocast_dtype_rows():
                print(f"  bf16 autocast: {row['tensor']:30s} {row['seen_dtype']}")
                writer.write({"shape": "toy", "part": "precision", **row})
            return
        print_param_counts(args.size)
        shared = {"batch": args.batch, "steps": args.steps}
        grid = (args.size, args.context, args.mode, args.dtype)
        print(
            f"{args.part}: sizes {' '.join(args.size)}; contexts {' '.join(map(str, args.context))}; "
            f"modes {' '.join(args.mode)}; dtypes {' '.join(args.dtype)}; batch {args.batch}; "
            f"{args.steps} timed steps"
        )
        if args.part == "profile":
            jobs = profile_jobs(*grid, warmup=args.warmup, top=args.top, nvtx_attention=args.nvtx_attention,
                                variants=args.variants, optimizer=args.optimizer, **shared)  # fmt: skip
            run_jobs(writer, jobs, on_row=print_profile)
        elif args.part == "memory":
            jobs = memory_jobs(*grid, batch=args.batch, snapshot_context=args.snapshot_context)
            run_jobs(writer, jobs, on_row=print_memory)
        elif args.part == "compile":
            from common.timing import compile_in_process

            compile_in_process()
            jobs = compile_jobs(args.size, args.context, args.mode, args.dtype, warmup=args.warmup, **shared)
            run_jobs(writer, jobs, on_row=print_step)
        elif args.part == "timing":
            run_cells(
                writer,
                timing_cells(
                    *grid, warmup=args.warmup, attention=args.attention, optimizer=args.optimizer, **shared
                ),
                on_row=print_step,
            )
        elif args.part == "warmup":
            run_cells(writer, warmup_cells(*grid, attention=args.attention, optimizer=args.optimizer, **shared),
                      on_row=print_step)  # fmt: skip
        else:
            from common.timing import compile_in_process

            compile_in_process()  # the compiled baselines' compiles: no pool of workers beside the timed steps
            cells = ours_cells(*grid, warmup=args.warmup, variants=args.variants, optimizer=args.optimizer,
                               **shared)  # fmt: skip
            run_cells(writer, cells, total=ours_total(*grid, variants=args.variants), on_row=print_step)


if __name__ == "__main__":
    main()
