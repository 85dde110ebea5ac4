"""Where a number came from: hardware, software versions, code version, machine, time, job."""

import datetime as dt
import functools
import os
import platform
import subprocess
from pathlib import Path

import torch

from .device import describe_device

REPO_ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


@functools.cache
def _static_provenance() -> dict:
    """The fields that cannot change while a process runs."""
    import triton  # after common.device has set TRITON_INTERPRET

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    # A copy of the tree without .git (a cluster staging dir, the lent GPU machine) names its
    # commit through TRITONLAB_COMMIT; its dirty state is then unknown.
    commit = _git("rev-parse", "--short=12", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no")) if commit else "unknown"
    # Written by a post-commit hook where one is installed. A copy whose stamp names another
    # commit than its own .git's HEAD (the lent GPU machine ships a stale .git) holds the stamp's.
    stamp = REPO_ROOT / ".tritonlab_commit"
    stamped = stamp.read_text().strip() if stamp.exists() else ""
    if stamped and stamped != commit:
        commit, dirty = stamped, "unknown"
    return {
        **describe_device(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda or "none",
        "cudnn": f"{cudnn // 10000}.{cudnn // 100 % 100}.{cudnn % 100}" if cudnn else "none",
        "git_commit": commit or os.environ.get("TRITONLAB_COMMIT", "unknown"),
        "git_dirty": dirty,
        "host": platform.node(),
    }


def provenance() -> dict:
    """Every column a result row carries besides its own measurements."""
    return {
        **_static_provenance(),
        "utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
        "slurm_array_job_id": os.environ.get("SLURM_ARRAY_JOB_ID", ""),
        "slurm_array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID", ""),
    }
