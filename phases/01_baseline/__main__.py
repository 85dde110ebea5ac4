"""Phase 01 -- the baseline: one TransformerNP training step on PyTorch SDPA, eager and compiled.

    python -m phases.01_baseline --shape mid            # or: just phase 01 --shape mid
    python -m phases.01_baseline --train                # a few hundred steps; the loss curve

For every SDPA backend and mode (eager, torch.compile) it measures the whole step -- forward,
backward, AdamW -- with per-stage times, tokens/s and peak memory, one CSV row per cell, and then
re-renders reports/01_baseline.md. Everything later phases do is measured against these rows.
"""

import argparse

from common import ON_GPU, SHAPES, ResultWriter, failure_row, interpreter_banner, resolve_shape
from common.report import render_phase

from .model import SDPA_BACKENDS, Components, TNPConfig, sdpa_attention
from .training import DTYPES, measure_training_step, train_loss_curve

PHASE = "01_baseline"
MODES = ("eager", "compile")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m phases.01_baseline", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shape",
        nargs="+",
        default=None,
        help=f"one or more of {', '.join(SHAPES)} (default: small on a GPU, tiny on the CPU)",
    )
    parser.add_argument("--batch", type=int, default=None, help="override the shape's batch size")
    parser.add_argument("--dtype", default="bf16", help="bf16 (autocast over fp32 weights) or fp32")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 10; 3 at large)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (compilation, autotuning)")
    parser.add_argument(
        "--sdpa-backend",
        nargs="+",
        default=None,
        help="SDPA backends to pin (default: cudnn flash on a GPU, math on the CPU)",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        default=None,
        choices=MODES,
        help="eager and/or compile (default: both on a GPU, eager on the CPU)",
    )
    parser.add_argument("--train", action="store_true", help="also train and log the loss curve")
    parser.add_argument(
        "--train-steps", type=int, default=None, help="training steps (default 300; 30 on CPU)"
    )
    args = parser.parse_args(argv)

    # Check every argument before any work starts.
    try:
        args.shapes = [resolve_shape(name, args.batch) for name in (args.shape or [None])]
    except ValueError as err:
        parser.error(str(err))
    if args.dtype not in DTYPES:
        parser.error(f"--dtype: unsupported {args.dtype!r}; expected one of {', '.join(DTYPES)}")
    args.sdpa_backend = args.sdpa_backend or (["cudnn", "flash"] if ON_GPU else ["math"])
    for backend in args.sdpa_backend:
        if backend not in SDPA_BACKENDS:
            parser.error(f"--sdpa-backend: unknown {backend!r}; expected one of {', '.join(SDPA_BACKENDS)}")
    args.modes = args.modes or (list(MODES) if ON_GPU else ["eager"])
    for name in ("steps", "warmup", "train_steps"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "warmup" else 1):
            parser.error(f"--{name.replace('_', '-')}: must be positive, got {value}")
    return args


def benchmark(args, writer: ResultWriter, cfg: TNPConfig) -> None:
    for shape in args.shapes:
        steps = args.steps or (3 if shape.name == "large" else 10)
        warmup = min(args.warmup, 1) if shape.name == "large" else args.warmup
        for mode in args.modes:
            for backend in args.sdpa_backend:
                variant = f"{mode}+sdpa-{backend}"
                cell = {
                    "variant": variant,
                    "shape": shape.name,
                    "dtype": args.dtype,
                    "mode": mode,
                    "sdpa_backend": backend,
                    "m_context": shape.m_context,
                    "n_target": shape.n_target,
                    "batch": shape.batch,
                    "tokens": shape.tokens,
                }
                print(f"  {variant:24s} {shape.label()} ...", end=" ", flush=True)
                try:
                    result = measure_training_step(
                        cfg,
                        Components(attention=sdpa_attention(backend)),
                        shape,
                        args.dtype,
                        compile_model=mode == "compile",
                        warmup=warmup,
                        steps=steps,
                    )
                except Exception as err:  # a failed cell is a row, and the sweep goes on
                    row = writer.write({**cell, **failure_row(err)})
                    print(f"{row['status']}: {row['error'][:120]}")
                    continue
                writer.write({**cell, **result.as_row()})
                print(
                    f"{result.step_ms:9.2f} ms/step  {result.tokens_per_s:12.0f} tok/s  "
                    f"fwd {result.forward_ms:.2f}  bwd {result.backward_ms:.2f}  opt {result.optimizer_ms:.2f} ms  "
                    f"peak {result.peak_mem_gb:.2f} GB"
                )


def train(args, writer: ResultWriter, cfg: TNPConfig) -> None:
    shape = resolve_shape("small" if ON_GPU else "tiny", args.batch)
    steps = args.train_steps or (300 if ON_GPU else 30)
    backend = args.sdpa_backend[0]
    print(f"training {steps} steps at {shape.label()} with sdpa-{backend}")
    curve = train_loss_curve(
        cfg,
        Components(attention=sdpa_attention(backend)),
        shape,
        args.dtype,
        steps=steps,
        log_every=max(steps // 30, 1),
    )
    for step, loss in curve:
        writer.write(
            {
                "variant": f"train+sdpa-{backend}",
                "shape": shape.name,
                "dtype": args.dtype,
                "m_context": shape.m_context,
                "n_target": shape.n_target,
                "batch": shape.batch,
                "step": step,
                "train_loss": loss,
            }
        )
        print(f"  step {step:5d}  loss {loss:.4f}")


def main(argv=None) -> None:
    args = parse_args(argv)
    print(interpreter_banner())
    cfg = TNPConfig()
    writer = ResultWriter(PHASE)
    benchmark(args, writer, cfg)
    if args.train:
        train(args, writer, cfg)
    print(f"rows: {writer.path}")
    print(f"report: {render_phase(PHASE)}")


if __name__ == "__main__":
    main()
