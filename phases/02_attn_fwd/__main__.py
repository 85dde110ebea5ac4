"""Phase 02 -- the attention forward in Triton, against SDPA cuDNN and SDPA flash.

    python -m phases.02_attn_fwd                          # small, mid, large (tiny on the CPU)
    python -m phases.02_attn_fwd --shape mid --sweep      # and the Lk sweep, Lq = 1.1 Lk

The TransformerNP's attention is rectangular: Lq = M+N queries over Lk = M context keys, with no
mask. ``attention_forward`` (attention.py) computes it with one program per block of query rows that
streams K and V through an online softmax. ``triton`` lets the autotuner choose tiles and the tile
loader -- tensor descriptors (Hopper's TMA engine copies tiles to shared memory asynchronously) or
block pointers (ordinary loads); ``triton-blockptr`` pins block pointers, for comparison. Every cell is checked
against SDPA (max abs error < 1e-2 in bf16) before it is timed; the chosen autotuning config is
recorded in each row. Afterwards reports/02_attn_fwd.md is re-rendered.
"""

from functools import partial

from common import ON_GPU, ResultWriter, interpreter_banner
from common.report import render_phase

from .attention import FWD_SEARCH_SPACE, attention_forward, last_forward_config
from .benchmark import measure, parse_args, sdpa_variants

PHASE = "02_attn_fwd"


def main(argv=None) -> None:
    args = parse_args("python -m phases.02_attn_fwd", __doc__.splitlines()[0], argv)
    print(interpreter_banner())
    print(
        f"autotuning search space (BLOCK_M, BLOCK_N, num_warps, num_stages): {FWD_SEARCH_SPACE}"
        + ("" if ON_GPU else " -- not used in the interpreter, which runs one fixed small config")
    )
    variants = {
        "triton": attention_forward,  # the autotuner picks tiles and loader (TMA or block pointers)
        "triton-blockptr": partial(attention_forward, impl="blockptr"),
        **sdpa_variants(),
    }

    def config_of(variant: str) -> dict:
        if not variant.startswith("triton"):
            return {}
        return {"config": last_forward_config(), "search_space": str(FWD_SEARCH_SPACE)}

    writer = ResultWriter(PHASE)
    measure(writer, variants, args.cases, backward=False, config_of=config_of)
    print(f"rows: {writer.path}")
    if not args.no_report:
        print(f"report: {render_phase(PHASE)}")


if __name__ == "__main__":
    main()
