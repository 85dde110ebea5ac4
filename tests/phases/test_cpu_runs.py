"""Every phase runs on a machine without a GPU -- a tiny shape in Triton's interpreter -- and leaves the
checkout as it found it: rows and report go to the git-ignored out/cpu/, never into reports/."""

import os
import subprocess
import sys

import pytest

from common import ON_GPU
from common.provenance import REPO_ROOT
from phases.__main__ import phase_names

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


@pytest.mark.parametrize("phase", [p for p in phase_names() if p not in CPU_ARGS])
def test_a_gpu_shape_is_refused_at_once_on_the_cpu(phase):
    out = subprocess.run(
        [sys.executable, "-m", "phases", phase, "--shape", "mid"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "interpreter" in out.stderr or "invalid choice" in out.stderr


@pytest.mark.parametrize("phase", phase_names())
def test_help_exits_zero_and_names_the_phase(phase):
    out = subprocess.run(
        [sys.executable, "-m", "phases", phase, "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"python -m phases {phase}" in out.stdout
