#!/usr/bin/env bash
# Installs Debian's Slurm (slurmctld, slurmd, slurm-client) for the `slurm` tests, when missing.
# The tests start their own throw-away cluster (slurm/local_cluster.py); this only installs binaries.
# Needs root and apt-get; anything else exits non-zero and the tests skip, saying why.
set -euo pipefail

if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null; then
    echo "slurm: already installed ($(dpkg-query -W -f '${Version}' slurmctld 2>/dev/null || echo 'version unknown'))"
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "slurm: not installed, and installing needs root; the slurm tests will be skipped" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null; then
    echo "slurm: not installed, and there is no apt-get here; the slurm tests will be skipped" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# The packages' postinst scripts try to start the daemons through systemd; without systemd they
# just fail to, which is what we want: the tests run their own.
apt-get install -y -qq slurmctld slurmd slurm-client >/dev/null
echo "slurm: installed ($(dpkg-query -W -f '${Version}' slurmctld))"
