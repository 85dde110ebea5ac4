"""Phase 03's cells: forward + two-pass backward of ``tritonlab.attention.attention`` against SDPA
cuDNN and SDPA flash, at the TransformerNP's shapes and the Lk sweep."""

from common.attention_bench import attention_cells, count_cells, sdpa_variants
from tritonlab.attention import attention


def cells(cases, dtype: str):
    chosen = {"triton-2pass": attention, **sdpa_variants()}
    return attention_cells(chosen, cases, backward=True, dtype=dtype), count_cells(chosen, cases)
