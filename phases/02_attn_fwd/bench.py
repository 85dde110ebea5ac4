"""Phase 02's cells: the forward of ``tritonlab.attention`` (the library's default -- the Gluon kernel on
Hopper from Lk = 1 000 on, else the autotuned Triton kernel -- and the Triton kernel pinned to each
loader) against SDPA cuDNN and SDPA flash, at the TransformerNP's shapes and the Lk sweep."""

from functools import partial

from common.attention_bench import attention_cells, count_cells, sdpa_variants
from tritonlab.attention import attention_forward


def variants() -> dict:
    return {
        "triton": attention_forward,  # impl="auto": what a user's call runs
        "triton-tma": partial(attention_forward, impl="tma"),  # the Triton kernel, TMA loads
        "triton-blockptr": partial(attention_forward, impl="blockptr"),
        **sdpa_variants(),
    }


def cells(cases, dtype: str):
    chosen = variants()
    return attention_cells(chosen, cases, backward=False, dtype=dtype), count_cells(chosen, cases)
