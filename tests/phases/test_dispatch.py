"""``python -m phases``: help lists the phases and exits 0, an unknown phase is an argparse error."""

import os
import subprocess
import sys

import pytest

from common.provenance import REPO_ROOT
from phases.__main__ import phase_names, resolve


def run(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "phases", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_help_lists_every_phase_and_exits_zero():
    out = run("--help")
    assert out.returncode == 0, out.stderr
    for name in phase_names():
        assert name in out.stdout


def test_no_argument_prints_usage_and_fails():
    out = run()
    assert out.returncode == 2 and "phases:" in out.stdout


def test_unknown_phase_lists_the_choices():
    out = run("99")
    assert out.returncode == 2 and "unknown phase" in out.stderr and "01_baseline" in out.stderr


@pytest.mark.parametrize("name", ["01", "01_baseline", "baseline"])
def test_phase_by_number_or_name(name):
    assert resolve(name) == "01_baseline"


def test_importing_the_harness_and_library_changes_no_environment():
    code = (
        "import os; before = dict(os.environ); import common, tritonlab, tritonlab.models; "
        "assert dict(os.environ) == before, set(os.environ) ^ set(before)"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in {"TRITON_INTERPRET", "TORCHINDUCTOR_COMPILE_THREADS"}
    }
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
