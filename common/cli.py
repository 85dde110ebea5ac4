"""The command line every phase shares: the same flags for the same things.

``--shape`` (the phase's named shapes), ``--dtype``, ``--out`` (where rows and the report go) and
``--no-report``; a phase adds its own (:func:`choices_argument` for a list of names such as
``--variants``). A bad value is argparse's error listing the valid choices (exit status 2). On a
machine without a GPU the kernels run in Triton's interpreter, where only the phase's tiny shapes
finish in reasonable time and memory: any other shape is refused at once, with the command to run
instead, before any work starts; so is bf16 where a phase's kernels take dots
(:func:`refuse_bf16_on_cpu`).

:func:`phase_run` is the body every phase's ``main`` shares: the interpreter banner, the rows'
writer, and after the phase's cells the rows' path and the report.
"""

import argparse
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from .device import ON_GPU, interpreter_banner
from .results import ResultWriter


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


def refuse_bf16_on_cpu(parser: argparse.ArgumentParser, *dtypes: str) -> None:
    """Refuse ``--dtype bf16`` without a GPU: Triton's interpreter computes bf16 dots wrongly."""
    if not ON_GPU and "bf16" in dtypes:
        parser.error("--dtype bf16: the interpreter's bf16 dots are wrong on the CPU; use fp16 or fp32 here")


def choices_argument(
    parser: argparse.ArgumentParser,
    flag: str,
    names: Sequence[str],
    metavar: str,
    *,
    all_by_default: bool = True,
    default_help: str = "all",
    what: str = "",
) -> None:
    """``flag`` takes one or more of ``names`` (e.g. ``--variants``); its default is all of them, or
    None with ``all_by_default=False`` (the phase then picks); ``default_help`` says what it is, and
    ``what``, if given, opens the help ("SDPA backends to pin, any of ...")."""
    parser.add_argument(
        flag,
        nargs="+",
        choices=names,
        default=list(names) if all_by_default else None,
        metavar=metavar,
        help=f"{what + ', ' if what else ''}any of {', '.join(names)} (default: {default_help})",
    )


@contextmanager
def phase_run(
    phase: str, report=None, *, no_report: bool = False, subdir: str = ""
) -> Iterator[ResultWriter]:
    """A phase's run: prints the interpreter banner and yields the rows' writer (under ``subdir`` of
    the phase's data); when the block ends, prints where the rows went and renders ``report`` (a
    ``common.report.PhaseReport``) unless ``no_report`` or there is none. A block that raises
    renders nothing."""
    print(interpreter_banner())
    writer = ResultWriter(phase, subdir=subdir)
    yield writer
    print(f"rows: {writer.path}")
    if report is not None and not no_report:
        from .report import render_phase  # pandas and matplotlib: only when a report is rendered

        print(f"report: {render_phase(report)}")


def require_at_least(
    parser: argparse.ArgumentParser, args: argparse.Namespace, minimums: dict[str, int]
) -> None:
    """Argparse's error (exit 2) for a count below its least value, e.g. ``{"steps": 1, "warmup": 0}``;
    an option left at None is not checked."""
    for name, least in minimums.items():
        value = getattr(args, name)
        if value is not None and value < least:
            parser.error(f"--{name.replace('_', '-')}: must be >= {least}, got {value}")
