"""Phase 04 -- the fused attention backward, against phase 03, SDPA cuDNN and SDPA flash.

    python -m phases.04_fused_attn                        # small, mid, large (tiny on the CPU)
    python -m phases.04_fused_attn --shape mid --sweep    # and the Lk sweep, Lq = 1.1 Lk
    python -m phases.04_fused_attn --two-pass-on small    # phase 03 side by side only at small
    python -m phases.04_fused_attn --graphed-on small mid  # also time CUDA-graph replays there

``attention`` (fused.py) runs phase 02's forward and a backward of one launch: key programs
accumulate dK, dV and query programs accumulate dQ side by side in the same grid, each computing
Δ = rowsum(dO ∘ O) on chip, so the preprocess launch of phase 03 disappears and both kinds of work
share the SMs. Each row records the autotuned config and the compiler's report for it (registers
per thread, spilled bytes). Timings are forward + backward, checked against SDPA first. On the shapes named by
``--graphed-on`` (small by default: its calls are bound by the host) every implementation is also
timed as a CUDA-graph replay of the same call (mode ``fwd+bwd graphed``).
"""

import argparse
import importlib

from common import ON_GPU, ResultWriter, interpreter_banner
from common.report import render_phase

from .fused import FUSED_SEARCH_SPACE, attention, last_fused_config

PHASE = "04_fused_attn"
fwd = importlib.import_module("phases.02_attn_fwd")
two_pass = importlib.import_module("phases.03_attn_bwd")
benchmark = importlib.import_module("phases.02_attn_fwd.benchmark")


def main(argv=None) -> None:
    # Phase 03 runs side by side on the TNP shapes named here (all by default): at the large
    # shape its autotuning alone takes about half a minute of device time.
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--two-pass-on", nargs="*", default=None)
    extra.add_argument("--graphed-on", nargs="*", default=["small"] if ON_GPU else [])
    known, rest = extra.parse_known_args(argv)
    args = benchmark.parse_args("python -m phases.04_fused_attn", __doc__.splitlines()[0], rest)
    print(interpreter_banner())
    print(
        "search space (BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2, num_warps, num_stages, KEYS_WRITE_DQ): "
        f"{FUSED_SEARCH_SPACE}"
    )
    variants = {"triton-fused": attention, **benchmark.sdpa_variants()}

    def config_of(variant: str) -> dict:
        if variant == "triton-fused":
            return {"config": fwd.last_forward_config(), **last_fused_config()}
        if variant == "triton-2pass":
            return {"config": fwd.last_forward_config(), **two_pass.last_backward_configs()}
        return {}

    writer = ResultWriter(PHASE)
    # The sweep (phase 03 has its own) runs without phase 03.
    tnp_cases = [c for c in args.cases if not c.name.startswith("sweep")]
    sweep_cases = [c for c in args.cases if c.name.startswith("sweep")]
    with_two_pass = {**variants, "triton-2pass": two_pass.attention}
    for case in tnp_cases:
        side_by_side = known.two_pass_on is None or case.name in known.two_pass_on
        chosen = with_two_pass if side_by_side else variants
        benchmark.measure(writer, chosen, [case], backward=True, config_of=config_of)
        if case.name in known.graphed_on:
            benchmark.measure(writer, chosen, [case], backward=True, config_of=config_of, graphed=True)
    benchmark.measure(writer, variants, sweep_cases, backward=True, config_of=config_of)
    print(f"rows: {writer.path}")
    if not args.no_report:
        print(f"report: {render_phase(PHASE)}")


if __name__ == "__main__":
    main()
