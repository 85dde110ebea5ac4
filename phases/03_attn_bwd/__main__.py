"""Phase 03 -- the attention backward in two passes, against SDPA cuDNN and SDPA flash.

    python -m phases 03                              # small, mid, large (tiny on the CPU)
    python -m phases 03 --shape mid --sweep          # and the Lk sweep, Lq = 1.1 Lk

``tritonlab.attention.attention`` is differentiable: phase 02's forward saves O and the logsumexp,
and the backward recomputes the probabilities from Q, K and that logsumexp -- never storing the
Lq x Lk matrix -- in four launches: Δ = rowsum(dO ∘ O); dK, dV by key block; the query chunks'
sum; dQ by query block. No atomics: the same inputs give the same bits. Each cell times forward +
backward (TFLOP/s count 3.5 x the forward's 4·B·H·Lq·Lk·D) after checking all four outputs
against SDPA.
"""

from common.attention_bench import attention_main

from .bench import cells
from .report import REPORT

PHASE = "03_attn_bwd"


def main(argv=None) -> None:
    attention_main(PHASE, __doc__, cells, REPORT, argv)


if __name__ == "__main__":
    main()
