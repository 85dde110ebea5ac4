"""``python -m phases 01 --shape mid``: run a phase by its number (``01``) or directory (``01_baseline``)."""

import runpy
import sys
from pathlib import Path

PHASES_DIR = Path(__file__).resolve().parent


def phase_names() -> list[str]:
    return sorted(p.name for p in PHASES_DIR.iterdir() if (p / "__main__.py").exists())


def resolve(name: str) -> str:
    names = phase_names()
    if name in names:
        return name
    matches = [n for n in names if n.split("_", 1)[0] == name.zfill(2) or n.split("_", 1)[-1] == name]
    if len(matches) != 1:
        raise SystemExit(f"phase: unknown phase {name!r}; expected a number or one of: {', '.join(names)}")
    return matches[0]


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in {"-h", "--help"}:
        raise SystemExit(f"usage: python -m phases <NN|name> [args...]\nphases: {', '.join(phase_names())}")
    phase = resolve(sys.argv[1])
    sys.argv = [f"phases.{phase}", *sys.argv[2:]]
    runpy.run_module(f"phases.{phase}", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
