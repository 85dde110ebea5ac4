"""Why the local cluster cannot start, said plainly (the slurm tests skip with this reason)."""

import os
import shutil

from slurm import local_cluster


def test_not_root_is_the_reason(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "needs root" in local_cluster.missing_reason()


def test_missing_binaries_are_named_with_the_fix(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(
        shutil, "which", lambda tool: None if tool in ("slurmd", "sbatch") else f"/usr/bin/{tool}"
    )
    reason = local_cluster.missing_reason()
    assert "missing slurmd, sbatch" in reason and ".ci/install_slurm.sh" in reason
