"""Phase 07 -- the 10 GMM heads as one grouped kernel, against the loop over heads, bmm and compile.

    python -m phases.07_grouped_gemm --shape small mid large     # or: just phase 07 --shape mid

At each TransformerNP shape's target count (B·N rows of z, d_model 512, 10 heads of 1365 hidden
units and 3 outputs, bf16) it measures side by side:
- loop: phase 01's ``gmm_heads_loop``, the spec's Python loop over the 10 head MLPs,
- bmm: the heads batched through ``torch.matmul``/``torch.bmm`` (a (10, T, 1365) hidden tensor),
- compile: the loop under ``torch.compile``,
- grouped: this phase's kernel (``gmm_heads``), the backward recomputing the hidden layer,
- grouped-save: the same, the forward keeping the pre-activation for the backward,
- grouped+nll: the grouped heads followed by phase 08's loss kernel -- the difference from
  ``grouped`` bounds what fusing the loss into this kernel's epilogue could save.
Rows: forward, backward, forward+backward ms, model TFLOP/s (3 × 2·T·13 650·(512 + 3)), memory,
errors vs an fp32 reference. Then it re-renders reports/07_grouped_gemm.md.
"""

import importlib

import torch

from common import ON_GPU

from .kernel import gmm_heads, gmm_heads_bmm, heads_fwd, heads_hidden_bwd

PHASE = "07_grouped_gemm"
baseline = importlib.import_module("phases.01_baseline")
sweep = importlib.import_module("phases.06_fused_mlp.bench")
TRITON_VARIANTS = {"grouped", "grouped-save", "grouped+nll"}  # their rows name the tiles they ran
AUTOTUNERS = {"fwd": heads_fwd, "hidden": heads_hidden_bwd}
loss_kernel = importlib.import_module("phases.08_gmm_logprob")


def variants(y: torch.Tensor) -> dict:
    """Every variant maps (z, w1, w2) to (T, K, 3), except grouped+nll, which ends in the scalar loss."""
    return {
        "loop": baseline.gmm_heads_loop,
        "bmm": gmm_heads_bmm,
        "compile": torch.compile(baseline.gmm_heads_loop, dynamic=False),
        "grouped": gmm_heads,
        "grouped-save": lambda z, w1, w2: gmm_heads(z, w1, w2, save_preactivation=True),
        "grouped+nll": lambda z, w1, w2: loss_kernel.gmm_nll(gmm_heads(z, w1, w2), y),
    }


def heads_then_loss(y: torch.Tensor):
    """Phase 01's heads and loss: the reference for grouped+nll."""
    return lambda z, w1, w2: baseline.gmm_nll(baseline.gmm_heads_loop(z, w1, w2), y)


def parse_args(argv=None):
    parser = sweep.sweep_arg_parser("python -m phases.07_grouped_gemm", __doc__.splitlines()[0])
    return sweep.parse_sweep_args(parser, list(variants(torch.zeros(1))), argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    writer = sweep.start_sweep(PHASE)
    # The real dims on a GPU; on the CPU the interpreter gets small ones (it runs, it measures nothing).
    d_model, d_hidden, n_heads = (512, 1365, 10) if ON_GPU else (64, 100, 3)
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    device = "cuda" if ON_GPU else "cpu"
    for shape in args.shapes:
        T = shape.batch * shape.n_target
        torch.manual_seed(0)
        z = torch.randn(T, d_model, device=device, dtype=dtype).requires_grad_()
        w1 = (
            torch.randn(n_heads, d_hidden, d_model, device=device, dtype=dtype) / d_model**0.5
        ).requires_grad_()
        w2 = (torch.randn(n_heads, 3, d_hidden, device=device, dtype=dtype) / d_hidden**0.5).requires_grad_()
        y = torch.randn(T, device=device)
        grad_heads = torch.randn(T, n_heads, 3, device=device, dtype=dtype)
        fns = variants(y)
        flops = 3 * 2 * T * n_heads * d_hidden * (d_model + 3)
        print(f"{shape.label()}: {T} targets, {n_heads} heads {d_model}->{d_hidden}->3, {dtype}")
        for name in args.variants:
            sizes = {"targets": T, "d_model": d_model, "d_hidden": d_hidden, "n_heads": n_heads}
            cell = sweep.sweep_cell(name, shape.name, dtype, **sizes)
            with_loss = name == "grouped+nll"
            reference = heads_then_loss(y) if with_loss else baseline.gmm_heads_loop
            grad_out = torch.ones((), device=device) if with_loss else grad_heads
            tiles = (lambda T=T: sweep.tiles_chosen(AUTOTUNERS, T)) if name in TRITON_VARIANTS else None
            sweep.measure_tflops_cell(
                writer, cell, 12, fns[name], reference, [z, w1, w2], grad_out, flops, tiles=tiles
            )
    sweep.finish_sweep(writer)


if __name__ == "__main__":
    main()
