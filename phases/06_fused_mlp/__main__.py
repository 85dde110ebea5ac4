"""Phase 06 -- the fused MLP y = silu(x W1ᵀ) W2ᵀ (forward in one Triton kernel) against eager and compile.

    python -m phases 06 --shape small mid large      # or: just phase 06 --shape mid

At the MLP's token count of each TransformerNP shape (B·(M+N) tokens, d_model 512, d_ff 1365) it
checks and times every variant's forward, backward and forward+backward side by side (see
``bench.py`` for the variants), writes one row per cell and renders the report. Without a GPU it
runs the tiny shape with small dims in Triton's interpreter: the code runs, nothing is measured.
"""

from common.fwd_bwd import fwd_bwd_main

from .bench import VARIANTS, cells
from .report import REPORT

PHASE = "06_fused_mlp"


def main(argv=None) -> None:
    fwd_bwd_main(PHASE, __doc__, VARIANTS, cells, REPORT, argv)


if __name__ == "__main__":
    main()
