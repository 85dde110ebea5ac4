"""Phase 07 -- the 10 GMM heads as one grouped kernel, against the loop over heads, bmm and compile.

    python -m phases 07 --shape small mid large      # or: just phase 07 --shape mid

At each TransformerNP shape's target count (B·N rows of z, d_model 512, 10 heads of 512 -> 1365 -> 3)
it runs phase 06's script (``common.fwd_bwd.fwd_bwd_main``) on this phase's variants (``bench.py``):
each one's forward, backward and forward+backward checked and timed side by side, a row per cell,
then the report; without a GPU, the tiny shape with small dims in Triton's interpreter, which
measures nothing.
"""

from common.fwd_bwd import fwd_bwd_main

from .bench import VARIANTS, cells
from .report import REPORT

PHASE = "07_grouped_gemm"


def main(argv=None) -> None:
    fwd_bwd_main(PHASE, __doc__, VARIANTS, cells, REPORT, argv)


if __name__ == "__main__":
    main()
