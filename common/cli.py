"""The command line every phase shares: the same flags for the same things.

``--shape`` (the phase's named shapes), ``--dtype``, ``--out`` (where rows and the report go) and
``--no-report``; a phase adds its own. A bad value is argparse's error listing the valid choices
(exit status 2). On a machine without a GPU the kernels run in Triton's interpreter, where only the
phase's tiny shapes finish in reasonable time and memory: any other shape is refused at once, with
the command to run instead, before any work starts.
"""

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from .device import ON_GPU


def phase_parser(
    phase: str,
    description: str,
    *,
    shapes: Sequence[str] = (),
    gpu_shapes: Sequence[str] = (),
    cpu_shapes: Sequence[str] = ("tiny",),
    dtypes: Sequence[str] = (),
    default_dtype: str | None = None,
    epilog: str | None = None,
) -> argparse.ArgumentParser:
    """A parser for ``python -m phases <phase>`` with the shared flags. ``shapes`` are the valid
    ``--shape`` values (none: the phase has no --shape); ``gpu_shapes`` the default on a GPU,
    ``cpu_shapes`` the default on the CPU and the only ones the interpreter may run."""
    parser = argparse.ArgumentParser(
        prog=f"python -m phases {phase}",
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(_phase=phase, _cpu_shapes=tuple(cpu_shapes))
    if shapes:
        parser.add_argument(
            "--shape",
            nargs="+",
            choices=list(shapes),
            default=list(gpu_shapes if ON_GPU else cpu_shapes),
            metavar="SHAPE",
            help=f"one or more of: {', '.join(shapes)} (default: {' '.join(gpu_shapes)} on a GPU, "
            f"{' '.join(cpu_shapes)} on the CPU, where only {', '.join(cpu_shapes)} may run)",
        )
    if dtypes:
        parser.add_argument(
            "--dtype",
            choices=list(dtypes),
            default=default_dtype or dtypes[0],
            help=f"input dtype, one of {', '.join(dtypes)} (default: %(default)s)",
        )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write rows to OUT/data/<phase>/ and the report to OUT/ (default: reports/ on a GPU, "
        "the git-ignored out/cpu/ on the CPU)",
    )
    parser.add_argument("--no-report", action="store_true", help="write rows only; skip the markdown report")
    return parser


def parse_phase_args(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """Parse, refuse shapes the CPU cannot run, and point rows at ``--out``."""
    args = parser.parse_args(argv)
    refuse_on_cpu(parser, getattr(args, "shape", None) or [], args._cpu_shapes)
    if args.out is not None:
        # Rows and reports are found through the data directory (common.results.data_dir).
        os.environ["TRITONLAB_DATA_DIR"] = str(args.out.resolve() / "data")
    return args


def refuse_on_cpu(parser: argparse.ArgumentParser, shapes: Sequence[str], cpu_shapes: Sequence[str]) -> None:
    if ON_GPU:
        return
    too_big = [s for s in shapes if s not in cpu_shapes]
    if too_big:
        parser.error(
            f"--shape {' '.join(too_big)}: too big for Triton's interpreter on a machine without a CUDA GPU "
            f"(it would run for hours or exhaust memory); run `python -m phases {parser.get_default('_phase')} "
            f"--shape {' '.join(cpu_shapes)}` here, or this shape on a GPU"
        )
