"""Phase 04 -- the fused attention backward, against phase 03, SDPA cuDNN and SDPA flash.

    python -m phases.04_fused_attn                        # small, mid, large (tiny on the CPU)
    python -m phases.04_fused_attn --shape mid --sweep    # and the Lk sweep, Lq = 1.1 Lk

``attention`` (fused.py) runs phase 02's forward and a backward of one launch: key programs
accumulate dK, dV and query programs accumulate dQ side by side in the same grid, each computing
Δ = rowsum(dO ∘ O) on chip, so the preprocess launch of phase 03 disappears and both kinds of work
share the SMs. Each row records the autotuned config and the compiler's report for it (registers
per thread, spilled bytes). Timings are forward + backward, checked against SDPA first.
"""

import importlib

from common import ResultWriter, interpreter_banner
from common.report import render_phase

from .fused import FUSED_SEARCH_SPACE, attention, last_fused_config

PHASE = "04_fused_attn"
fwd = importlib.import_module("phases.02_attn_fwd")
two_pass = importlib.import_module("phases.03_attn_bwd")
benchmark = importlib.import_module("phases.02_attn_fwd.benchmark")


def main(argv=None) -> None:
    args = benchmark.parse_args("python -m phases.04_fused_attn", __doc__.splitlines()[0], argv)
    print(interpreter_banner())
    print(f"search space (BLOCK_M, BLOCK_N, num_warps, num_stages): {FUSED_SEARCH_SPACE}")
    variants = {"triton-fused": attention, **benchmark.sdpa_variants()}

    def config_of(variant: str) -> dict:
        if variant == "triton-fused":
            return {"config": fwd.last_forward_config(), **last_fused_config()}
        if variant == "triton-2pass":
            return {"config": fwd.last_forward_config(), **two_pass.last_backward_configs()}
        return {}

    writer = ResultWriter(PHASE)
    # Phase 03 runs side by side on the TNP shapes; the sweep (phase 03 has its own) skips it.
    tnp_cases = [c for c in args.cases if not c.name.startswith("sweep")]
    sweep_cases = [c for c in args.cases if c.name.startswith("sweep")]
    with_two_pass = {**variants, "triton-2pass": two_pass.attention}
    benchmark.measure(writer, with_two_pass, tnp_cases, backward=True, config_of=config_of)
    benchmark.measure(writer, variants, sweep_cases, backward=True, config_of=config_of)
    print(f"rows: {writer.path}")
    if not args.no_report:
        print(f"report: {render_phase(PHASE)}")


if __name__ == "__main__":
    main()
