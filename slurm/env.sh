# Sourced by every template, from the repository root (the directory you ran sbatch in).
#
#   PY      the Python that runs phases (default: `uv run python`, which syncs .venv first).
#           Compute nodes without internet: `uv sync --locked` on a login node, then submit with
#           UV_OFFLINE=1 (or UV_NO_SYNC=1); or use an interpreter that has torch: PY=python3.
#           It is the same variable the justfile reads.

mkdir -p reports/logs
PY=${PY:-uv run python}
export PYTHONUNBUFFERED=1
# As many CPU threads as CPUs allocated, not as the node has (torch would use them all).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-}}}
[[ -n "$OMP_NUM_THREADS" ]] || unset OMP_NUM_THREADS
echo "[$(date -u +%FT%TZ)] job ${SLURM_JOB_ID:-(none)}${SLURM_ARRAY_JOB_ID:+ = array task ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}} on $(hostname), PY=$PY"
