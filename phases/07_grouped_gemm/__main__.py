"""Phase 07 -- the 10 GMM heads as one grouped kernel, against the loop over heads, bmm and compile.

    python -m phases.07_grouped_gemm --shape small mid large     # or: just phase 07 --shape mid

At each TransformerNP shape's target count (B·N rows of z, d_model 512, 10 heads of 1365 hidden
units and 3 outputs, bf16) it measures side by side:
- loop: phase 01's ``gmm_heads_loop``, the spec's Python loop over the 10 head MLPs,
- bmm: the heads batched through ``torch.matmul``/``torch.bmm`` (a (10, T, 1365) hidden tensor),
- compile: the loop under ``torch.compile``,
- grouped: this phase's kernel (``gmm_heads``),
- grouped+nll: the grouped heads followed by phase 08's loss kernel -- the difference from
  ``grouped`` bounds what fusing the loss into this kernel's epilogue could save.
Rows: forward, backward, forward+backward ms, model TFLOP/s (3 × 2·T·13 650·(512 + 3)), memory,
errors vs an fp32 reference. Then it re-renders reports/07_grouped_gemm.md.
"""

import argparse
import importlib

import torch

from common import ON_GPU, SHAPES, ResultWriter, failure_row, interpreter_banner, resolve_shape
from common.report import render_phase

from .kernel import gmm_heads, gmm_heads_bmm

PHASE = "07_grouped_gemm"
baseline = importlib.import_module("phases.01_baseline")
bench = importlib.import_module("phases.06_fused_mlp.bench")
loss_kernel = importlib.import_module("phases.08_gmm_logprob")


def variants(y: torch.Tensor) -> dict:
    """Every variant maps (z, w1, w2) to (T, K, 3), except grouped+nll, which ends in the scalar loss."""
    return {
        "loop": baseline.gmm_heads_loop,
        "bmm": gmm_heads_bmm,
        "compile": torch.compile(baseline.gmm_heads_loop, dynamic=False),
        "grouped": gmm_heads,
        "grouped+nll": lambda z, w1, w2: loss_kernel.gmm_nll(gmm_heads(z, w1, w2), y),
    }


def heads_then_loss(y: torch.Tensor):
    """Phase 01's heads and loss: the reference for grouped+nll."""
    return lambda z, w1, w2: baseline.gmm_nll(baseline.gmm_heads_loop(z, w1, w2), y)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m phases.07_grouped_gemm", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--shape",
        nargs="+",
        default=None,
        help=f"any of {', '.join(SHAPES)} (default: small mid large on a GPU, tiny on the CPU)",
    )
    parser.add_argument("--variants", nargs="+", default=None, help="a subset of the variants (default: all)")
    args = parser.parse_args(argv)
    args.shapes = [
        resolve_shape(n) for n in (args.shape or (["small", "mid", "large"] if ON_GPU else ["tiny"]))
    ]
    known = list(variants(torch.zeros(1)))
    args.variants = args.variants or known
    for name in args.variants:
        if name not in known:
            parser.error(f"--variants: unknown {name!r}; expected any of {', '.join(known)}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    print(interpreter_banner())
    # The real dims on a GPU; on the CPU the interpreter gets small ones (it runs, it measures nothing).
    d_model, d_hidden, n_heads = (512, 1365, 10) if ON_GPU else (64, 100, 3)
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    device = "cuda" if ON_GPU else "cpu"
    writer = ResultWriter(PHASE)
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
            cell = {
                "variant": name,
                "shape": shape.name,
                "dtype": str(dtype).removeprefix("torch."),
                "targets": T,
                "d_model": d_model,
                "d_hidden": d_hidden,
                "n_heads": n_heads,
            }
            with_loss = name == "grouped+nll"
            reference = heads_then_loss(y) if with_loss else baseline.gmm_heads_loop
            grad_out = torch.ones((), device=device) if with_loss else grad_heads
            try:
                errors = bench.check_against(fns[name], reference, [z, w1, w2], grad_out)
                result = bench.measure_fwd_bwd(fns[name], [z, w1, w2], grad_out)
            except Exception as err:  # a failed cell is a row; the sweep goes on
                row = writer.write({**cell, **failure_row(err)})
                print(f"  {name:12s} {row['status']}: {row['error'][:160]}")
                continue
            tflops = flops / (result["fwd_bwd_ms"] * 1e-3) / 1e12
            writer.write({**cell, **errors, **result, "fwd_bwd_tflops": tflops})
            print(
                f"  {name:12s} fwd {result['fwd_ms']:8.3f}  bwd {result['bwd_ms']:8.3f}  fwd+bwd "
                f"{result['fwd_bwd_ms']:8.3f} ms  {tflops:6.1f} TFLOP/s  saved {result['saved_mb']:8.1f} MB  "
                f"peak {result['peak_mb']:8.1f} MB  err {errors['err_out']:.1e}/{errors['err_grad']:.1e}"
            )
    print(f"rows: {writer.path}")
    print(f"report: {render_phase(PHASE)}")


if __name__ == "__main__":
    main()
