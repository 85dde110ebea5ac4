"""Phase 07: the 10 GMM head MLPs as one grouped Triton kernel (stacked first layer, block-diagonal second)."""

import common  # noqa: F401  -- first: on a machine without a GPU it selects the interpreter

from .kernel import check_heads_inputs, gmm_heads, gmm_heads_bmm, heads_fwd, heads_hidden_bwd

__all__ = ["check_heads_inputs", "gmm_heads", "gmm_heads_bmm", "heads_fwd", "heads_hidden_bwd"]
