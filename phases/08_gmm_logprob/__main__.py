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

import importlib
from functools import partial

import torch

from common import ON_GPU, bench

from .kernel import gmm_nll

PHASE = "08_gmm_logprob"
baseline = importlib.import_module("phases.01_baseline")
sweep = importlib.import_module("phases.06_fused_mlp.bench")


def variants() -> dict:
    return {
        "eager": baseline.gmm_nll,
        "compile": torch.compile(baseline.gmm_nll, dynamic=False),
        "fused": gmm_nll,
    }


def parse_args(argv=None):
    parser = sweep.sweep_arg_parser("python -m phases.08_gmm_logprob", __doc__.splitlines()[0])
    parser.add_argument(
        "--rows", nargs="+", type=int, default=[], help="extra target counts, a bandwidth sweep"
    )
    args = sweep.parse_sweep_args(parser, [*variants(), "copy"], argv)
    for rows in args.rows:
        if rows < 1:
            parser.error(f"--rows: must be positive, got {rows}")
    args.cells = [(s.name, s.batch * s.n_target) for s in args.shapes] + [(f"T={r}", r) for r in args.rows]
    return args


def time_copy(n_bytes: int, device: str) -> dict:
    """The bandwidth ceiling: one device-to-device copy reading and writing n_bytes in all."""
    src = torch.empty(n_bytes // 2, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    timing = bench(lambda: dst.copy_(src), **sweep.BENCH)
    return {
        "fwd_bwd_ms": timing.ms,
        "fwd_bwd_p20_ms": timing.p20_ms,
        "fwd_bwd_p80_ms": timing.p80_ms,
        "reps": timing.reps,
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    writer = sweep.start_sweep(PHASE)
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    device = "cuda" if ON_GPU else "cpu"
    n_components = 10
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
            sizes = {"targets": T, "n_components": n_components, "bytes": min_bytes}
            cell = sweep.sweep_cell(name, shape_name, dtype, **sizes)
            if name == "copy":
                measure = partial(time_copy, min_bytes, device)
            else:
                measure = partial(
                    sweep.check_and_measure, fns[name], baseline.gmm_nll, [params, y], grad_loss
                )
            result = sweep.run_cell(writer, cell, 8, measure)
            if result is None:
                continue
            gbps = min_bytes / (result["fwd_bwd_ms"] * 1e-3) / 1e9
            writer.write({**cell, **result, "fwd_bwd_gbps": gbps})
            times = (
                f"fwd {result['fwd_ms']:8.4f}  bwd {result['bwd_ms']:8.4f}  "
                if "fwd_ms" in result
                else " " * 34
            )
            print(
                f"  {name:8s} {times}fwd+bwd {result['fwd_bwd_ms']:8.4f} ms  {gbps:7.1f} GB/s"
                + (f"  err {result['err_out']:.1e}/{result['err_grad']:.1e}" if "err_out" in result else "")
            )
    sweep.finish_sweep(writer)


if __name__ == "__main__":
    main()
