"""A real single-node Slurm cluster for the ``slurm`` tests, and a clean copy of the repository.

The cluster (slurm/local_cluster.py) starts once per session; its daemons are stopped by PID in the
finalizer. Where it cannot start (not root, Slurm not installed) the tests skip and say why --
unless TRITONLAB_REQUIRE_SLURM=1 (CI), where a missing Slurm is a failure, not a skip.
"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm.local_cluster import LocalCluster, missing_reason

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def session_cluster(tmp_path_factory):
    """Started once for all the slurm tests; stopped by PID at the end of the session."""
    reason = missing_reason()
    if reason:
        if os.environ.get("TRITONLAB_REQUIRE_SLURM") == "1":
            pytest.fail(f"TRITONLAB_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
    local = LocalCluster(tmp_path_factory.mktemp("slurm"))
    try:
        local.start()
        yield local
    finally:
        local.stop()


@pytest.fixture
def cluster(session_cluster):
    """The cluster, left with an empty queue whatever the test did (a failed test may leave jobs)."""
    yield session_cluster
    session_cluster.run("scancel", "--full", "--user=root", check=False)
    deadline = time.monotonic() + 30
    while session_cluster.run("squeue", "-h", "-o", "%i", check=False).stdout.strip():
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)


@pytest.fixture
def checkout(tmp_path) -> Path:
    """The repository's files as a fresh clone has them, so jobs write rows, logs and reports
    there, never into the real reports/."""

    def git_files(*args: str) -> list[str]:
        out = subprocess.run(["git", "ls-files", "-z", *args], cwd=REPO, capture_output=True, check=True)
        return [name for name in out.stdout.decode().split("\0") if name]

    # Tracked files, plus this subsystem's own new files while they are not yet committed.
    files = git_files("--cached") + git_files("--others", "--exclude-standard", "--", "slurm", "tests/slurm")
    root = tmp_path / "checkout"
    for name in files:
        src = REPO / name
        if src.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / name)
    # Slurm cannot create the directory of --output (the job dies at launch), so a clone must
    # already have reports/logs/; test_matrix.py checks that it does, and says how to fix it.
    (root / "reports" / "logs").mkdir(parents=True, exist_ok=True)
    return root


def job_env(cluster: LocalCluster, **extra: str) -> dict:
    """What a user's shell would have: no test-only data dir, no Slurm variables of an outer job.

    Jobs run `uv run python` (the templates' default) against the already-synced environment,
    offline, since the copy has no .venv of its own; without uv they use this interpreter."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "SBATCH_", "TRITONLAB_", "UV_")) and k not in ("PY", "VIRTUAL_ENV")
    }
    env["SLURM_CONF"] = str(cluster.conf)
    head = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    env["TRITONLAB_COMMIT"] = head.stdout.strip() or "unknown"
    if shutil.which("uv") and sys.prefix != sys.base_prefix:
        env.update(UV_PROJECT_ENVIRONMENT=sys.prefix, UV_FROZEN="1", UV_OFFLINE="1")
    else:
        env["PY"] = sys.executable
    env.update(extra)
    return env
