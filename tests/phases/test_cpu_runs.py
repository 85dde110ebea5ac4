"""Every phase runs on a machine without a GPU -- a tiny shape in Triton's interpreter -- and leaves the
checkout as it found it: rows and report go to the git-ignored out/cpu/, never into reports/."""

import os
import subprocess
import sys

import pytest

from common import ON_GPU
from common.provenance import REPO_ROOT
from phases.__main__ import phase_names, run_phase

# The command each phase runs by default on the CPU; a phase with subcommands names its smallest.
CPU_ARGS = {"flash2": ["flash-bench", "--quick"]}

pytestmark = pytest.mark.skipif(ON_GPU, reason="what a machine without a GPU does")


def git_status() -> str:
    out = subprocess.run(["git", "status", "--porcelain"], cwd=REPO_ROOT, capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else "(not a git checkout)"


@pytest.mark.parametrize("phase", phase_names())
def test_a_cpu_run_leaves_the_checkout_clean(phase):
    env = {k: v for k, v in os.environ.items() if k != "TRITONLAB_DATA_DIR"}
    before = git_status()
    out = subprocess.run(
        [sys.executable, "-m", "phases", phase, *CPU_ARGS.get(phase, [])],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "TRITON_INTERPRET=1" in out.stdout  # the run says it measured nothing
    assert git_status() == before
    assert (REPO_ROOT / "out" / "cpu" / "data" / phase).is_dir()
    report = (REPO_ROOT / "out" / "cpu" / f"{phase}.md").read_text()
    assert "CPU smoke runs" in report and "## Verdict" not in report


def run_in_process(phase: str, argv: list[str], capsys) -> tuple[int, str, str]:
    """``python -m phases <phase> <argv>`` for a command that ends in argparse (help, a refused value):
    run in this process, which has torch and the phases imported already -- a fresh interpreter per
    case would spend ~5 s of the suite on imports alone. The exit status, stdout and stderr."""
    environ = dict(os.environ)  # the entry point sets variables for its run; keep them out of later tests
    try:
        with pytest.raises(SystemExit) as exited:
            run_phase(phase, argv)
    finally:
        os.environ.clear()
        os.environ.update(environ)
    out = capsys.readouterr()
    return exited.value.code or 0, out.out, out.err


@pytest.mark.parametrize("phase", [p for p in phase_names() if p not in CPU_ARGS])
def test_a_gpu_shape_is_refused_at_once_on_the_cpu(phase, capsys):
    code, out, err = run_in_process(phase, ["--shape", "mid"], capsys)
    assert code == 2, out[-2000:] + err[-2000:]
    assert "interpreter" in err or "invalid choice" in err


@pytest.mark.parametrize("phase", phase_names())
def test_help_exits_zero_and_names_the_phase(phase, capsys):
    code, out, err = run_in_process(phase, ["--help"], capsys)
    assert code == 0, err[-2000:]
    assert f"python -m phases {phase}" in out
