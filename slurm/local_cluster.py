"""A throw-away single-node Slurm cluster on localhost, to try the templates without a real one.

    python -m slurm.local_cluster up /tmp/slurm-local      # prints the SLURM_CONF to export
    SLURM_CONF=/tmp/slurm-local/slurm.conf sbatch slurm/run_matrix.sbatch
    python -m slurm.local_cluster down /tmp/slurm-local

It needs root and Debian's ``slurmctld slurmd slurm-client`` (``.ci/install_slurm.sh``). Everything
-- config, state, spool, logs, pid files -- lives under the given directory, and both daemons run
in the foreground (``-D``) as children we stop by PID. Authentication is ``auth/none`` (Slurm 22.05
has no ``auth/slurm``), so munge is not needed; never expose such a cluster beyond localhost.

The node advertises two GPUs so that the real templates, which ask for ``--gres=gpu:1``, run
unchanged: Slurm only wants ``File=`` to name character devices, so we ``mknod`` two fake NVIDIA
device nodes (major 195) that nothing ever opens.
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol")
FAKE_GPUS = 2
# Job slots, whatever the machine has: two tasks run at once and the rest wait, on every machine
# (config_overrides lets slurmd accept more CPUs than a one-core machine has).
CPUS = 2


def missing_reason() -> str | None:
    """Why a local cluster cannot start here, or None when it can."""
    if os.name != "posix" or os.geteuid() != 0:
        return "a local Slurm cluster needs root (the daemons run as root with auth/none)"
    absent = [tool for tool in DAEMONS + CLIENTS if shutil.which(tool) is None]
    if absent:
        return (
            f"Slurm is not installed (missing {', '.join(absent)}); run `bash .ci/install_slurm.sh` as root"
        )
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(root: Path) -> Path:
    """slurm.conf and gres.conf under ``root``; returns the path of slurm.conf."""
    for sub in ("state", "spool", "dev"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for i in range(FAKE_GPUS):
        node = root / "dev" / f"nvidia{i}"
        if not node.exists():
            os.mknod(node, 0o600 | 0o020000, os.makedev(195, i))  # S_IFCHR
    conf = f"""\
ClusterName=tritonlab-local
SlurmctldHost=localhost
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=batch_sched_delay=0,sched_interval=1,bf_interval=1
DependencyParameters=kill_invalid_depend
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
MinJobAge=3600
ReturnToService=2
SlurmdParameters=config_overrides
GresTypes=gpu
NodeName=localhost NodeAddr=127.0.0.1 CPUs={CPUS} Gres=gpu:{FAKE_GPUS} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""
    (root / "slurm.conf").write_text(conf)
    (root / "gres.conf").write_text(
        f"NodeName=localhost Name=gpu File={root}/dev/nvidia[0-{FAKE_GPUS - 1}]\n"
    )
    return root / "slurm.conf"


class LocalCluster:
    """slurmctld + slurmd under ``root``; ``start()`` returns once the node accepts jobs."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.procs: list[subprocess.Popen] = []

    def start(self, timeout: float = 60) -> "LocalCluster":
        reason = missing_reason()
        if reason:
            raise RuntimeError(reason)
        write_config(self.root)
        commands = [["slurmctld", "-D", "-i"], ["slurmd", "-D", "-N", "localhost"]]
        for cmd in commands:
            log = open(self.root / f"{cmd[0]}.stderr", "w")  # noqa: SIM115 -- lives as long as the daemon
            self.procs.append(
                subprocess.Popen(
                    cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
        self._wait_until_idle(timeout)
        return self

    def _wait_until_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}:\n{self.logs()}")
            out = self.run("sinfo", "-h", "-N", "-o", "%T", check=False)
            state = out.stdout.strip()
            if state in ("idle", "mixed", "allocated"):
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"the local node did not become idle in {timeout:.0f} s (state {state!r}):\n{self.logs()}"
        )

    def run(self, *cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, check=check, timeout=timeout)

    def logs(self, tail: int = 40) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log", "slurmctld.stderr", "slurmd.stderr"):
            path = self.root / name
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-tail:]
                parts.append(f"--- {name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel every job, then stop both daemons by PID (SIGTERM, then SIGKILL)."""
        if any(p.poll() is None for p in self.procs):
            self.run("scancel", "--full", "--user=root", check=False)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self.procs.clear()


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m slurm.local_cluster", description=__doc__.splitlines()[0]
    )
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("root", type=Path, help="directory for config, state and logs")
    args = parser.parse_args()
    root = args.root.resolve()
    if args.action == "up":
        cluster = LocalCluster(root).start()
        # Detach: the daemons outlive this command; `down` stops them by the PIDs recorded here.
        (root / "pids").write_text(" ".join(str(p.pid) for p in cluster.procs))
        print(f"export SLURM_CONF={cluster.conf}")
        return
    pids = [int(p) for p in (root / "pids").read_text().split()]
    subprocess.run(
        ["scancel", "--full", "--user=root"],
        env={**os.environ, "SLURM_CONF": str(root / "slurm.conf")},
        check=False,
        capture_output=True,
    )
    for pid in reversed(pids):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    (root / "pids").unlink()


if __name__ == "__main__":
    main()
