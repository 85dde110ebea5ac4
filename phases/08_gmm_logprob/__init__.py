"""Phase 08: the GMM negative log-likelihood, one Triton kernel forward and one backward."""

import common  # noqa: F401  -- first: on a machine without a GPU it selects the interpreter

from .kernel import gmm_nll, gmm_nll_bwd_kernel, gmm_nll_fwd_kernel

__all__ = ["gmm_nll", "gmm_nll_bwd_kernel", "gmm_nll_fwd_kernel"]
