"""tritonlab: GPU training kernels written in Triton.

Import the kernels by what they compute::

    from tritonlab.attention import attention, fused_attention, attention_forward
    from tritonlab.mlp import fused_mlp
    from tritonlab.grouped_gemm import gmm_heads
    from tritonlab.gmm import gmm_nll
    from tritonlab.ops import rms_norm, gelu, swiglu, rope, cross_entropy, quantize_fp8

Every kernel runs on a CUDA GPU. On a machine without one, Triton's interpreter runs the same
kernels on CPU tensors (slowly, for tests and smoke runs): set ``TRITON_INTERPRET=1`` in the
environment *before* ``tritonlab`` (or anything else that defines Triton kernels) is imported,
as the lab's entry points do (``python -m phases`` and the tests' conftest). Importing tritonlab
never changes the environment.

``tritonlab.preload()`` starts, in a background thread, what Triton does once per process before
its first launch (about half a second on an H100 host) and PyTorch's own first use of cuBLAS, an
RMSNorm and the autograd engine (a tiny warm-up: 0.1-0.2 s off a first step); call it early in a
training script, before building the model. ``tritonlab.models.build`` calls it for a CUDA model.
"""

from ._runtime import preload

__version__ = "0.1.0"
__all__ = ["preload"]
