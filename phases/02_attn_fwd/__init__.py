"""Phase 02: the attention forward in Triton -- online softmax, fp32 accumulators, autotuned tiles."""

import common  # noqa: F401  -- first: on a machine without a GPU it selects the interpreter

from .attention import (
    DEFAULT_IMPL,
    FWD_SEARCH_SPACE,
    HEAD_DIMS,
    IMPLS,
    LOG2E,
    attention_forward,
    autotuned,
    check_inputs,
    checked_forward,
    chosen_config,
    dot_precision,
    last_forward_config,
    shape_bucket,
    strides4,
    tuning_bench,
)

__all__ = [
    "DEFAULT_IMPL",
    "FWD_SEARCH_SPACE",
    "HEAD_DIMS",
    "IMPLS",
    "LOG2E",
    "attention_forward",
    "autotuned",
    "check_inputs",
    "checked_forward",
    "chosen_config",
    "dot_precision",
    "last_forward_config",
    "shape_bucket",
    "strides4",
    "tuning_bench",
]
