"""Phase 03 -- the attention backward in two passes, against SDPA cuDNN and SDPA flash.

    python -m phases.03_attn_bwd                          # small, mid, large (tiny on the CPU)
    python -m phases.03_attn_bwd --shape mid --sweep      # and the Lk sweep, Lq = 1.1 Lk

``attention`` (backward.py) is differentiable: phase 02's forward saves O and the logsumexp, and
the backward recomputes the probabilities from Q, K and that logsumexp -- never storing the
Lq x Lk matrix -- in four launches: Δ = rowsum(dO ∘ O); dK, dV by key block (query rows split
into chunks when there are too few key blocks to fill the GPU); the chunks' sum; dQ by query
block. No atomics: the same inputs give the same bits. Each cell times forward + backward
(TFLOP/s count 3.5 x the forward's 4·B·H·Lq·Lk·D) after checking all four outputs against SDPA.
"""

import importlib

from common import ResultWriter, interpreter_banner
from common.report import render_phase

from .backward import DKDV_SEARCH_SPACE, DQ_SEARCH_SPACE, attention, last_backward_configs

PHASE = "03_attn_bwd"
fwd = importlib.import_module("phases.02_attn_fwd")
benchmark = importlib.import_module("phases.02_attn_fwd.benchmark")


def main(argv=None) -> None:
    args = benchmark.parse_args("python -m phases.03_attn_bwd", __doc__.splitlines()[0], argv)
    print(interpreter_banner())
    print(
        f"search spaces (BLOCK_M, BLOCK_N, num_warps, num_stages): dK/dV {DKDV_SEARCH_SPACE}, dQ {DQ_SEARCH_SPACE}"
    )
    variants = {"triton-2pass": attention, **benchmark.sdpa_variants()}

    def config_of(variant: str) -> dict:
        if not variant.startswith("triton"):
            return {}
        return {"config": fwd.last_forward_config(), **last_backward_configs()}

    writer = ResultWriter(PHASE)
    benchmark.measure(writer, variants, args.cases, backward=True, config_of=config_of)
    print(f"rows: {writer.path}")
    if not args.no_report:
        print(f"report: {render_phase(PHASE)}")


if __name__ == "__main__":
    main()
