"""Phase 07's cells: the 10 mixture heads at each TransformerNP shape's target count, every variant.

At B·N rows of z (d_model 512, 10 heads of 1365 hidden units and 3 outputs; small dims on the CPU,
where the interpreter only checks that the code runs), side by side in one run:
- loop: ``tritonlab.models.gmm_heads_loop``, the spec's Python loop over the 10 head MLPs,
- bmm: the heads batched through ``torch.matmul``/``torch.bmm`` (a (10, T, 1365) hidden tensor),
- compile: the loop under ``torch.compile``,
- grouped: ``gmm_heads``, the backward recomputing the hidden layer,
- grouped-save: the same, the forward keeping the pre-activation for the backward,
- grouped+nll: the grouped heads followed by ``tritonlab.gmm.gmm_nll`` -- the difference from
  ``grouped`` bounds what fusing the loss into this kernel's epilogue could save.
Each row: forward, backward, forward+backward ms, model TFLOP/s (3 × 2·T·13 650·(512 + 3)), memory,
errors vs a float32 reference (checked first) and, for the Triton variants, the tiles picked.
"""

from collections.abc import Iterator

import torch

from common import ON_GPU, Cell
from common.fwd_bwd import GEMM_HEAD_START_MS, fwd_bwd_cell
from tritonlab.gmm import gmm_nll
from tritonlab.grouped_gemm import gmm_heads, gmm_heads_bmm
from tritonlab.models import gmm_heads_loop, resolve_shape
from tritonlab.models import gmm_nll as gmm_nll_eager
from tritonlab.tuning import ConfigRecord

# The real dims on a GPU; on the CPU the interpreter gets small ones (it runs, it measures nothing).
D_MODEL, D_HIDDEN, N_HEADS = (512, 1365, 10) if ON_GPU else (64, 100, 3)
TRITON_VARIANTS = ("grouped", "grouped-save", "grouped+nll")
VARIANTS = ("loop", "bmm", "compile", *TRITON_VARIANTS)


def variant_fn(name: str, y: torch.Tensor, record: ConfigRecord):
    """(z, w1, w2) -> (T, K, 3), except grouped+nll, which ends in the scalar loss."""
    return {
        "loop": lambda: gmm_heads_loop,
        "bmm": lambda: gmm_heads_bmm,
        "compile": lambda: torch.compile(gmm_heads_loop, dynamic=False),
        "grouped": lambda: lambda z, w1, w2: gmm_heads(z, w1, w2, record=record),
        "grouped-save": lambda: (
            lambda z, w1, w2: gmm_heads(z, w1, w2, save_preactivation=True, record=record)
        ),
        "grouped+nll": lambda: lambda z, w1, w2: gmm_nll(gmm_heads(z, w1, w2, record=record), y),
    }[name]()


def heads_then_loss(y: torch.Tensor):
    """The eager heads and loss: the reference for grouped+nll."""
    return lambda z, w1, w2: gmm_nll_eager(gmm_heads_loop(z, w1, w2), y)


def cells(shapes: list[str], variants: list[str], dtype: torch.dtype) -> Iterator[Cell]:
    device = "cuda" if ON_GPU else "cpu"
    for name in shapes:
        shape = resolve_shape(name)
        T = shape.batch * shape.n_target
        torch.manual_seed(0)
        z = torch.randn(T, D_MODEL, device=device, dtype=dtype).requires_grad_()
        w1 = torch.randn(N_HEADS, D_HIDDEN, D_MODEL, device=device, dtype=dtype) / D_MODEL**0.5
        w2 = torch.randn(N_HEADS, 3, D_HIDDEN, device=device, dtype=dtype) / D_HIDDEN**0.5
        inputs = [z, w1.requires_grad_(), w2.requires_grad_()]
        y = torch.randn(T, device=device)
        grad_heads = torch.randn(T, N_HEADS, 3, device=device, dtype=dtype)
        sizes = {"targets": T, "d_model": D_MODEL, "d_hidden": D_HIDDEN, "n_heads": N_HEADS}
        for variant in variants:
            record = ConfigRecord()
            with_loss = variant == "grouped+nll"
            yield fwd_bwd_cell(
                variant,
                name,
                dtype,
                sizes,
                variant_fn(variant, y, record),
                heads_then_loss(y) if with_loss else gmm_heads_loop,
                inputs,
                torch.ones((), device=device) if with_loss else grad_heads,
                flops=3 * 2 * T * N_HEADS * D_HIDDEN * (D_MODEL + 3),
                head_start_ms=GEMM_HEAD_START_MS,
                record=record if variant in TRITON_VARIANTS else None,
            )
