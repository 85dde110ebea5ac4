"""Phase 04: the attention backward fused into one launch that recomputes the tiles on chip."""

import common  # noqa: F401  -- first: on a machine without a GPU it selects the interpreter

from .fused import FUSED_SEARCH_SPACE, attention, fused_attention_backward, last_fused_config

__all__ = ["FUSED_SEARCH_SPACE", "attention", "fused_attention_backward", "last_fused_config"]
