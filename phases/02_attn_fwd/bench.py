"""Phase 02's cells: the forward of ``tritonlab.attention`` (autotuned loader, and block pointers
pinned) against SDPA cuDNN and SDPA flash, at the TransformerNP's shapes and the Lk sweep."""

from functools import partial

from common.attention_bench import attention_cells, count_cells, sdpa_variants
from tritonlab.attention import attention_forward


def variants() -> dict:
    return {
        "triton": attention_forward,  # the autotuner picks tiles and loader (TMA or block pointers)
        "triton-blockptr": partial(attention_forward, impl="blockptr"),
        **sdpa_variants(),
    }


def cells(cases, dtype: str):
    chosen = variants()
    return attention_cells(chosen, cases, backward=False, dtype=dtype), count_cells(chosen, cases)
