"""Phase 04's cells: forward + fused backward of ``tritonlab.attention.fused_attention`` against the
two-pass backward (``attention``), SDPA cuDNN and SDPA flash; plain calls and CUDA-graph replays."""

from common.attention_bench import attention_cells, count_cells, sdpa_variants
from tritonlab.attention import attention, fused_attention


def deterministic_fused_attention(q, k, v, record=None):
    return fused_attention(q, k, v, deterministic=True, record=record)


def variants(two_pass: bool) -> dict:
    """The fused backward (dQ by atomics on Hopper) and SDPA; at the model's shapes also the fused
    backward's deterministic mode and, with ``two_pass``, the two-pass backward."""
    chosen = {"triton-fused": fused_attention, **sdpa_variants()}
    return (
        {**chosen, "triton-fused-det": deterministic_fused_attention, "triton-2pass": attention}
        if two_pass
        else chosen
    )


def cells(cases, dtype: str, two_pass_on, graphed_on):
    """TNP cases with the two-pass backward where ``two_pass_on`` names them (None: every one), and
    again as graph replays where ``graphed_on`` does; sweep points with the fused backward and SDPA."""
    plan = []
    for case in cases:
        tnp = not case.name.startswith("sweep")
        chosen = variants(tnp and (two_pass_on is None or case.name in two_pass_on))
        plan.append((chosen, case, False))
        if tnp and case.name in graphed_on:
            plan.append((chosen, case, True))

    def generate():
        for chosen, case, graphed in plan:
            yield from attention_cells(chosen, [case], backward=True, dtype=dtype, graphed=graphed)

    return generate(), sum(count_cells(chosen, [case]) for chosen, case, _ in plan)
