"""``python -m phases <NN|name> [args...]``: run one phase; ``python -m phases report``: re-render reports.

This is the lab's entry point. On a machine without a CUDA GPU it switches Triton to its
interpreter before any kernel is imported, so every phase also runs (a tiny shape, slowly) on the
CPU. It is also the one place that imports a phase by name.
"""

import argparse
import importlib
import os
import runpy
import sys
from pathlib import Path

from common.device import use_interpreter_without_gpu
from common.timing import compile_in_process

PHASES_DIR = Path(__file__).resolve().parent


def phase_names() -> list[str]:
    return sorted(p.name for p in PHASES_DIR.iterdir() if (p / "__main__.py").exists())


def title(name: str) -> str:
    """The phase's README title (its first line), e.g. "02_attn_fwd — attention forward"."""
    readme = PHASES_DIR / name / "README.md"
    return readme.read_text().splitlines()[0].lstrip("# ").strip() if readme.exists() else name


def summary(name: str) -> str:
    return title(name).removeprefix(name).lstrip(" —·:-") or name


def resolve(name: str) -> str | None:
    names = phase_names()
    if name in names:
        return name
    matches = [n for n in names if n.split("_", 1)[0] == name.zfill(2) or n.split("_", 1)[-1] == name]
    return matches[0] if len(matches) == 1 else None


def phase_module(name: str, module: str = ""):
    """``phases.<phase>[.<module>]`` by number or name -- how the tests and ``report`` reach a phase."""
    phase = resolve(name)
    if phase is None:
        raise ValueError(f"phase: unknown {name!r}; expected a number or one of {', '.join(phase_names())}")
    use_interpreter_without_gpu()
    return importlib.import_module(f"phases.{phase}" + (f".{module}" if module else ""))


def run_phase(name: str, argv: list[str]) -> None:
    """Run a phase's script as ``python -m phases.<phase>`` would, with ``argv`` as its arguments."""
    phase = resolve(name)
    use_interpreter_without_gpu()
    compile_in_process()
    saved = sys.argv
    sys.argv = [f"python -m phases {phase}", *argv]
    try:
        runpy.run_module(f"phases.{phase}", run_name="__main__", alter_sys=True)
    finally:
        sys.argv = saved


def report(names: list[str], data: Path | None = None) -> None:
    """Re-render reports from the CSVs under ``data``: by default the committed ``reports/data`` on
    any machine (rendering reads rows, it runs no kernel) unless ``TRITONLAB_DATA_DIR`` names
    another; the Slurm collector passes the directory its cells wrote to (``out/cpu/data`` on a
    node without a GPU). Reports go beside the data directory."""
    from common.provenance import REPO_ROOT
    from common.report import render_all, render_phase, reports_dir, write_index

    if data is not None:
        os.environ["TRITONLAB_DATA_DIR"] = str(data)
    os.environ.setdefault("TRITONLAB_DATA_DIR", str(REPO_ROOT / "reports" / "data"))
    every = [
        phase_module(n, "report").REPORT for n in phase_names() if (PHASES_DIR / n / "report.py").exists()
    ]
    if not names:
        for path in render_all(every):
            print(f"report: {path}")
        return
    for name in names:
        phase = resolve(name)
        chosen = [r for r in every if r.name == phase]
        if not chosen:
            raise SystemExit(
                f"report: unknown phase {name!r}; expected one of {', '.join(r.name for r in every)}"
            )
        path = render_phase(chosen[0])
        print(f"report: {path}" if path else f"report: {phase}: no data")
    print(f"index: {write_index(reports_dir(), every)}")


def parser() -> argparse.ArgumentParser:
    lines = "\n".join(
        f"  {n.split('_', 1)[0] if n[0].isdigit() else n:14s} {n:16s} {summary(n)}" for n in phase_names()
    )
    p = argparse.ArgumentParser(
        prog="python -m phases",
        description="Run one phase of the lab (a benchmark and its report), or re-render every report.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"phases:\n{lines}\n  report         (re-render reports/*.md from reports/data; optional phase names)\n\n"
        "Each phase has its own help: python -m phases 02 --help",
    )
    p.add_argument("phase", metavar="PHASE", help="a phase's number or name, or `report`")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the phase's own arguments")
    return p


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = parser()
    if not argv or argv[0] in {"-h", "--help"}:
        p.print_help()
        raise SystemExit(0 if argv else 2)
    if argv[0] == "report":
        report(argv[1:])
        return
    if resolve(argv[0]) is None:
        p.error(
            f"argument PHASE: unknown phase {argv[0]!r}; expected `report`, a number or one of: {', '.join(phase_names())}"
        )
    run_phase(argv[0], argv[1:])


if __name__ == "__main__":
    main()
