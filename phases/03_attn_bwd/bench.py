"""Phase 03's cells: forward + two-pass backward of ``tritonlab.attention.attention`` against SDPA
cuDNN and SDPA flash, at the TransformerNP's shapes and the Lk sweep; on a GPU also our forward with
cuDNN's backward (``attention_with_cudnn_backward``), the pairing a user wanting the fastest step takes."""

from common import ON_GPU
from common.attention_bench import attention_cells, count_cells, sdpa_variants
from tritonlab.attention import attention, attention_with_cudnn_backward

# cuDNN's backward needs a CUDA GPU: on the CPU the variant is left out, not an error row.
CUDNN_BACKWARD = {"triton+cudnn-bwd": attention_with_cudnn_backward} if ON_GPU else {}


def cells(cases, dtype: str):
    chosen = {"triton-2pass": attention, **CUDNN_BACKWARD, **sdpa_variants()}
    return attention_cells(chosen, cases, backward=True, dtype=dtype), count_cells(chosen, cases)
