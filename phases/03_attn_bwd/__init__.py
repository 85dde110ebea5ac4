"""Phase 03: the attention backward in two passes (dK/dV by key block, dQ by query block), no atomics."""

import common  # noqa: F401  -- first: on a machine without a GPU it selects the interpreter

from .backward import (
    DKDV_SEARCH_SPACE,
    DQ_SEARCH_SPACE,
    INTERPRETER_CONFIG,
    AttentionFunction,
    attention,
    attention_backward,
    dkdv_tile,
    dq_row_block,
    dq_tile,
    key_grad_buffers,
    last_backward_configs,
    like_q_layout,
    load_row_stats,
    load_rows,
    partial_strides,
    plan_query_chunks,
    prune_wide,
    reduce_key_grads,
    row_delta,
    store_key_block,
)

__all__ = [
    "DKDV_SEARCH_SPACE",
    "DQ_SEARCH_SPACE",
    "INTERPRETER_CONFIG",
    "AttentionFunction",
    "attention",
    "attention_backward",
    "dkdv_tile",
    "dq_row_block",
    "dq_tile",
    "key_grad_buffers",
    "last_backward_configs",
    "like_q_layout",
    "load_row_stats",
    "load_rows",
    "partial_strides",
    "plan_query_chunks",
    "prune_wide",
    "reduce_key_grads",
    "row_delta",
    "store_key_block",
]
