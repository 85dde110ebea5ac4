"""Phase 08 -- the GMM negative log-likelihood in one kernel each way, against eager, compile and a copy.

    python -m phases.08_gmm_logprob --shape small mid large     # or: just phase 08 --shape mid
    python -m phases.08_gmm_logprob --rows 1048576 4194304      # add a bandwidth sweep

At each TransformerNP shape's target count (B·N rows of (10, 3) bf16 mixture parameters) and at
any extra ``--rows``, it measures side by side:
- eager: phase 01's ``gmm_nll`` (log_softmax, logsumexp and a dozen elementwise kernels each way),
- compile: the same under ``torch.compile``,
- fused: this phase's two kernels (forward writes the scalar, backward writes d params),
- copy: a device-to-device copy moving the same number of bytes as the fused forward+backward's
  minimum traffic (params and y read twice, d params written once) -- the bandwidth ceiling.
GB/s counts that minimum traffic for every variant. Then it re-renders reports/08_gmm_logprob.md.
"""

import argparse
import importlib

import torch

from common import ON_GPU, SHAPES, ResultWriter, bench, failure_row, interpreter_banner, resolve_shape
from common.report import render_phase

from .kernel import gmm_nll

PHASE = "08_gmm_logprob"
baseline = importlib.import_module("phases.01_baseline")
fwd_bwd = importlib.import_module("phases.06_fused_mlp.bench")


def variants() -> dict:
    return {
        "eager": baseline.gmm_nll,
        "compile": torch.compile(baseline.gmm_nll, dynamic=False),
        "fused": gmm_nll,
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m phases.08_gmm_logprob", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--shape",
        nargs="+",
        default=None,
        help=f"any of {', '.join(SHAPES)} (default: small mid large on a GPU, tiny on the CPU)",
    )
    parser.add_argument(
        "--rows", nargs="+", type=int, default=[], help="extra target counts, a bandwidth sweep"
    )
    parser.add_argument("--variants", nargs="+", default=None, help="a subset of the variants (default: all)")
    args = parser.parse_args(argv)
    shapes = [resolve_shape(n) for n in (args.shape or (["small", "mid", "large"] if ON_GPU else ["tiny"]))]
    for rows in args.rows:
        if rows < 1:
            parser.error(f"--rows: must be positive, got {rows}")
    args.cells = [(s.name, s.batch * s.n_target) for s in shapes] + [(f"T={r}", r) for r in args.rows]
    known = [*variants(), "copy"]
    args.variants = args.variants or known
    for name in args.variants:
        if name not in known:
            parser.error(f"--variants: unknown {name!r}; expected any of {', '.join(known)}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    print(interpreter_banner())
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    device = "cuda" if ON_GPU else "cpu"
    n_components = 10
    writer = ResultWriter(PHASE)
    fns = variants()
    for shape_name, T in args.cells:
        torch.manual_seed(0)
        params = torch.randn(T, n_components, 3, device=device, dtype=dtype).requires_grad_()
        y = torch.randn(T, device=device)
        grad_loss = torch.ones((), device=device)
        param_bytes = params.numel() * params.element_size()
        min_bytes = 2 * (param_bytes + y.numel() * y.element_size()) + param_bytes
        print(
            f"{shape_name}: {T} targets × {n_components} components, {dtype}, {min_bytes / 1e6:.1f} MB moved"
        )
        for name in args.variants:
            cell = {
                "variant": name,
                "shape": shape_name,
                "dtype": str(dtype).removeprefix("torch."),
                "targets": T,
                "n_components": n_components,
                "bytes": min_bytes,
            }
            try:
                if name == "copy":
                    src = torch.empty(min_bytes // 2, dtype=torch.uint8, device=device).random_()
                    dst = torch.empty_like(src)
                    timing = bench(lambda src=src, dst=dst: dst.copy_(src), **fwd_bwd.BENCH)
                    result, errors = (
                        {
                            "fwd_bwd_ms": timing.ms,
                            "fwd_bwd_p20_ms": timing.p20_ms,
                            "fwd_bwd_p80_ms": timing.p80_ms,
                            "reps": timing.reps,
                        },
                        {},
                    )
                else:
                    errors = fwd_bwd.check_against(fns[name], baseline.gmm_nll, [params, y], grad_loss)
                    result = fwd_bwd.measure_fwd_bwd(fns[name], [params, y], grad_loss)
            except Exception as err:  # a failed cell is a row; the sweep goes on
                row = writer.write({**cell, **failure_row(err)})
                print(f"  {name:8s} {row['status']}: {row['error'][:160]}")
                continue
            gbps = min_bytes / (result["fwd_bwd_ms"] * 1e-3) / 1e9
            writer.write({**cell, **errors, **result, "fwd_bwd_gbps": gbps})
            times = (
                f"fwd {result['fwd_ms']:8.4f}  bwd {result['bwd_ms']:8.4f}  "
                if "fwd_ms" in result
                else " " * 34
            )
            print(
                f"  {name:8s} {times}fwd+bwd {result['fwd_bwd_ms']:8.4f} ms  {gbps:7.1f} GB/s"
                + (f"  err {errors['err_out']:.1e}/{errors['err_grad']:.1e}" if errors else "")
            )
    print(f"rows: {writer.path}")
    print(f"report: {render_phase(PHASE)}")


if __name__ == "__main__":
    main()
