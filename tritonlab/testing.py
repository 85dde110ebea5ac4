"""Helpers for checking kernels against references, shared by the tests and the benchmarks.

- ``rel_err``: ``||got - ref|| / ||ref||`` in float64 (NaN anywhere gives NaN, which fails any bound);
- ``model_qkv``: q, k, v laid out as the TransformerNP makes them (strided views of its projections);
- ``same_layout_leaf``: a fresh leaf tensor that keeps a view's strides (``clone()`` would make it dense);
- ``output_and_grads`` / ``check_against_float64``: a function's output and input gradients
  against a reference run in float64 on the same inputs;
- ``poisoned_empty``: new tensors NaN-filled, so an output element a kernel forgets to write shows
  up instead of passing on stale memory;
- ``DTYPES`` / ``dtype_name``: the short dtype names rows and command lines use;
- ``run_without_interpreter``: Python code in a fresh process where Triton compiles for a GPU
  target (a CPU test's sm_90 build), though this one runs the interpreter.
"""

import contextlib
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

from ._runtime import kernel_device_type

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> "bf16" (the names of ``DTYPES``; others by their torch name)."""
    for name, d in DTYPES.items():
        if d == dtype:
            return name
    return str(dtype).removeprefix("torch.")


# Elements per float64 chunk of rel_err: 128 MiB a tensor, whatever the size of the whole.
REL_ERR_CHUNK = 1 << 24


def rel_err(got: torch.Tensor, ref: torch.Tensor, scale: float = 0.0) -> float:
    """||got - ref|| / max(||ref||, scale) in float64.

    ``scale`` is for results that cancel to almost nothing (RMSNorm's dx at width 1): the size of the
    terms that cancelled is then the yardstick for rounding error, not the tiny remainder.

    The sums of squares run in float64 chunks on ``got``'s device, never a whole float64 copy: made
    whole on the host, a (16384, 128256) gradient's check moved three 17 GB float64 tensors, and each
    of kernel_suite's cells at that size took 37 s on the H100 machine for 3 ms of timed work.
    The two tensors must hold the same number of elements (no broadcasting)."""
    got, ref = got.detach().flatten(), ref.detach().flatten()
    if got.numel() != ref.numel():
        raise ValueError(f"rel_err: got has {got.numel()} elements, ref has {ref.numel()}")
    diff_sq = ref_sq = 0.0
    for start in range(0, got.numel(), REL_ERR_CHUNK):
        g = got[start : start + REL_ERR_CHUNK].double()
        r = ref[start : start + REL_ERR_CHUNK].to(g.device, torch.float64)
        diff_sq += (g - r).square().sum().item()
        ref_sq += r.square().sum().item()
    return math.sqrt(diff_sq) / max(math.sqrt(ref_sq), scale, 1e-300)


def max_abs_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return (got.detach().double() - ref.detach().double()).abs().max().item()


def model_qkv(B, H, Lq, Lk, D, dtype=torch.bfloat16, scale_inputs=1.0, seed=0, device=None):
    """q, k, v as the TransformerNP makes them: transposed views of (B, L, H·D) projections, on the
    device the kernels take (``device``, by default the GPU, or the CPU in Triton's interpreter)."""
    device = device or kernel_device_type()
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, Lq, H * D, generator=g, device=device) * scale_inputs
    kv = torch.randn(B, Lk, 2 * H * D, generator=g, device=device) * scale_inputs
    q = q.to(dtype).view(B, Lq, H, D).transpose(1, 2)
    kv = kv.to(dtype).view(B, Lk, 2, H, D)
    return q, kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)


def same_layout_leaf(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A fresh leaf with t's values and t's very strides (in ``dtype`` if given). ``clone()`` would
    make a view with gaps (every second column, one of q/k/v in a fused projection) dense, and a
    test would no longer pass the layout it means to."""
    copy = torch.empty_strided(t.shape, t.stride(), dtype=dtype or t.dtype, device=t.device)
    return copy.copy_(t.detach()).requires_grad_(t.requires_grad or t.is_floating_point())


def output_and_grads(fn, inputs, grad_out, dtype: torch.dtype | None = None):
    """[fn's output, the gradient of every input] on fresh leaves with the inputs' layouts."""
    leaves = [same_layout_leaf(t, dtype) for t in inputs]
    out = fn(*leaves)
    grad = grad_out if dtype is None else grad_out.to(dtype)
    return [out, *torch.autograd.grad(out, leaves, grad)]


def check_against_float64(fn, reference, inputs, grad_out, tol: float, names) -> dict[str, float]:
    """fn's output and input gradients (``names``, in that order) against ``reference`` run in
    float64; asserts dtype, shape, finiteness and ``rel_err < tol`` for each, returns the errors."""
    got = output_and_grads(fn, inputs, grad_out)
    want = output_and_grads(reference, inputs, grad_out, dtype=torch.float64)
    errors = {}
    for name, g, w in zip(names, got, want, strict=True):
        assert g.dtype == inputs[0].dtype, (name, g.dtype)
        assert g.shape == w.shape, (name, g.shape, w.shape)
        assert torch.isfinite(g).all(), f"{name}: not finite"
        errors[name] = rel_err(g, w)
        assert errors[name] < tol, (name, errors[name], tol)
    return errors


@contextlib.contextmanager
def poisoned_empty():
    """Inside the block every new float tensor from ``torch.empty``-like calls is NaN-filled (integers
    get their maximum), so an output element a kernel forgets to write fails every check instead of
    passing on stale memory. Uses PyTorch's own switch (deterministic mode, warnings only)."""
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0])
        torch.utils.deterministic.fill_uninitialized_memory = previous[1]


def triton_tools_missing(*names: str) -> bool:
    """Whether any of the named CUDA tools that Triton bundles (``ptxas``, ``cuobjdump``) is absent:
    the tests that build sm_90 code on the CPU (``run_without_interpreter``) skip then."""
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    return not all((bundled / name).exists() for name in names)


def hopper_descriptor_type(block_rows: int, head_dim: int, dtype: str = "bf16") -> str:
    """The signature type of a bf16 (or ``dtype``: "fp32") (B, H, L, D) host tensor descriptor with
    tiles of ``block_rows`` rows of one head, as Triton names it: what a CPU test's sm_90a build of
    a Gluon attention kernel (``tritonlab/attention/*_hopper.py``) passes for each descriptor
    argument."""
    bits = {"bf16": 16, "fp32": 32}[dtype]
    return (
        f"tensordesc<{dtype}[1, 1, {block_rows}, {head_dim}],NVMMASharedLayout(swizzle_byte_width=128, "
        f"element_bitwidth={bits}, rank=4, transposed=False, fp4_padded=False, cga_layout=[])>"
    )


def run_without_interpreter(code: str, *args: str) -> subprocess.CompletedProcess:
    """Python ``code`` (``sys.argv[1:]`` = ``args``) in a fresh process without ``TRITON_INTERPRET``,
    from the directory that holds the ``tritonlab`` package: Triton there compiles for GPU targets
    (no GPU is needed to compile). A failing process is an ``AssertionError`` carrying its stderr."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=root
    )
    if out.returncode != 0:
        raise AssertionError(f"the subprocess exited with {out.returncode}:\n{out.stderr[-4000:]}")
    return out
