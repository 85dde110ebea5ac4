# tritonlab: `just --list` shows every recipe.
# Recipes run through `uv run`. Where uv cannot sync (an offline GPU node with its own torch),
# run them with a plain interpreter instead:  PY=python3 just phase 02 --shape mid

PY := env_var_or_default("PY", "uv run python")

# Run one phase by number or name, e.g. `just phase 01 --shape mid` or `just phase flash2 flash-bench`
phase NAME *ARGS:
    {{PY}} -m phases {{NAME}} {{ARGS}}

# CPU test suite (Triton interpreter mode), one pytest-xdist worker per core up to four (the Slurm
# tests share one); extra pytest arguments pass through (`-n 0` runs it in one process)
test *ARGS:
    TRITON_INTERPRET=1 {{PY}} -m pytest -m "not gpu" -q -n auto --maxprocesses 4 --dist loadgroup {{ARGS}}

# GPU tests (real kernels, bf16 and float32 against float64): on a CUDA machine
test-gpu *ARGS:
    {{PY}} -m pytest -m gpu -q {{ARGS}}

# Slurm end-to-end tests against a local single-node cluster: need root (to install Debian's Slurm
# packages: bash .ci/install_slurm.sh) and start slurmctld and slurmd on localhost; they skip otherwise
test-slurm *ARGS:
    {{PY}} -m pytest -m slurm -q {{ARGS}}

# Re-render every markdown report from the CSVs under reports/data
report *PHASES:
    {{PY}} -m phases report {{PHASES}}

# ruff: lint and format check
lint:
    {{PY}} -m ruff check .
    {{PY}} -m ruff format --check .

# ruff: fix what can be fixed automatically
fmt:
    {{PY}} -m ruff check --fix .
    {{PY}} -m ruff format .

# Slurm job for one phase on one GPU, e.g. `just slurm-phase 03 --shape mid` (SBATCH_* variables: slurm/README.md)
slurm-phase NAME *ARGS:
    mkdir -p reports/logs
    sbatch --job-name=tritonlab-{{NAME}} slurm/phase.sbatch {{NAME}} {{ARGS}}

# Slurm job array of the benchmark matrix, then the reports; ARGS are sbatch flags, e.g. --partition=gpu --time=2:00:00
slurm-matrix *ARGS:
    bash slurm/run_matrix.sbatch {{ARGS}}

# Slurm: your queued and running jobs, and the newest logs under reports/logs/
slurm-status:
    squeue --me --format="%.12i %.24j %.9T %.10M %.10l %R"
    @ls -t reports/logs 2>/dev/null | grep -v '^\.' | head -n 8 | sed 's|^|reports/logs/|' || true
