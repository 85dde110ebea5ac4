"""One package per phase; ``python -m phases <NN|name> [args...]`` runs one by number or name."""
