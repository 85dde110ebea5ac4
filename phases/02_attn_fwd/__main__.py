"""Phase 02 -- the attention forward in Triton, against SDPA cuDNN and SDPA flash.

    python -m phases 02                              # small, mid, large (tiny on the CPU)
    python -m phases 02 --shape mid --sweep          # and the Lk sweep, Lq = 1.1 Lk

The TransformerNP's attention is rectangular: Lq = M+N queries over Lk = M context keys, no mask.
``tritonlab.attention.attention_forward`` computes it with one program per block of query rows
that streams K and V through an online softmax. ``triton`` is the library's default call: on Hopper
from Lk = 1 000 on the warp-specialised Gluon kernel, else the Triton kernel with the autotuner's
tiles and loader; ``triton-tma`` and ``triton-blockptr`` pin the Triton kernel and its loader.
Every cell is checked against SDPA before it is timed; each row records the chosen config.
"""

from common.attention_bench import attention_main

from .bench import cells
from .report import REPORT

PHASE = "02_attn_fwd"


def main(argv=None) -> None:
    attention_main(PHASE, __doc__, cells, REPORT, argv)


if __name__ == "__main__":
    main()
