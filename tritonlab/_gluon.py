"""What the Gluon kernels on Hopper share (attention's forwards and backward, sparse_ffn's GEMM): a
warpgroup's wgmma accumulator layout, and TMA descriptors over a tensor's own shape and strides with
the shared-memory layout wgmma reads (NVMMA-swizzled)."""

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor


@gluon.constexpr_function
def mma_layout(n):
    """A warpgroup's accumulator layout for 64 x n results (wgmma's m16 x n instructions)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


def _gl_dtype(dtype: torch.dtype):
    return {
        torch.bfloat16: gl.bfloat16,
        torch.float16: gl.float16,
        torch.float32: gl.float32,
        torch.float8_e4m3fn: gl.float8e4nv,
    }[dtype]


@functools.cache
def shared_layout(block: tuple, dtype: torch.dtype):
    # Built once per tile shape and dtype: a few microseconds of host time per descriptor otherwise.
    return gl.NVMMASharedLayout.get_default_for(list(block), _gl_dtype(dtype))


def block_descriptor(t: torch.Tensor, block: tuple) -> TensorDescriptor:
    """``t``'s TMA descriptor over its own shape and strides, tiles of ``block``."""
    return TensorDescriptor(t, list(t.shape), list(t.stride()), list(block), shared_layout(block, t.dtype))
