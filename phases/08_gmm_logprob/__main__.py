"""Phase 08 -- the GMM negative log-likelihood in one kernel each way, against eager, compile and a copy.

    python -m phases.08_gmm_logprob --shape small mid large     # or: just phase 08 --shape mid
    python -m phases.08_gmm_logprob --rows 1048576 4194304      # add a bandwidth sweep
    python -m phases.08_gmm_logprob --graphed-on small          # graph replays on these cells only

At each TransformerNP shape's target count (B·N rows of (10, 3) bf16 mixture parameters) and at
any extra ``--rows``, it measures side by side:
- eager: phase 01's ``gmm_nll`` (log_softmax, logsumexp and a dozen elementwise kernels each way),
- compile: the same under ``torch.compile``,
- fused: this phase's two kernels (forward writes the scalar, backward writes d params),
- copy: a device-to-device copy moving the same number of bytes as the fused forward+backward's
  minimum traffic (params and y read twice, d params written once) -- the bandwidth ceiling.
GB/s counts that minimum traffic for every variant.

Each variant is timed in two modes (the ``mode`` column):
- autograd: forward and ``autograd.grad`` called from Python, as an eager training step runs them;
- graphed: the same forward+backward captured once in a CUDA graph and timed as replays, as a
  graphed training step (phase 10) runs them. At the model's token counts the autograd calls are
  bound by the host's time (~0.2 ms for 5-10 µs of kernels); a replay has no host work per call,
  so it compares the kernels. The replay is checked first: on fresh inputs in the buffers the graph
  reads, into a poisoned gradient, against a float32 reference.
``--graphed-on`` names the cells timed both ways (default: all of them on a GPU; none on the CPU,
which has no CUDA graphs). Then it re-renders reports/08_gmm_logprob.md.
"""

import importlib
from functools import partial

import torch

from common import ON_GPU, bench, graph_replay

from .kernel import gmm_nll

PHASE = "08_gmm_logprob"
baseline = importlib.import_module("phases.01_baseline")
sweep = importlib.import_module("phases.06_fused_mlp.bench")

# A replayed gradient must match the float32 reference as closely as a plain call's does: bf16
# rounds it once on the way out (the autograd rows read ~1.7e-3).
GRAPHED_GRAD_TOLERANCE = 1e-2


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
    parser.add_argument(
        "--graphed-on",
        nargs="*",
        default=None,
        metavar="CELL",
        help="cells (e.g. small, T=1048576) also timed as CUDA-graph replays "
        "(default: every cell on a GPU, none on the CPU; the flag alone: none)",
    )
    args = sweep.parse_sweep_args(parser, [*variants(), "copy"], argv)
    for rows in args.rows:
        if rows < 1:
            parser.error(f"--rows: must be positive, got {rows}")
    args.cells = [(s.name, s.batch * s.n_target) for s in args.shapes] + [(f"T={r}", r) for r in args.rows]
    names = [name for name, _ in args.cells]
    if args.graphed_on is None:
        args.graphed_on = names if ON_GPU else []
    elif args.graphed_on and not ON_GPU:
        parser.error("--graphed-on: CUDA-graph replays need a CUDA GPU, and this machine has none")
    for name in args.graphed_on:
        if name not in names:
            parser.error(
                f"--graphed-on: {name!r} is not a cell of this run; expected any of {', '.join(names)}"
            )
    return args


def timing_columns(fn) -> dict:
    timing = bench(fn, **sweep.BENCH)
    return {
        "fwd_bwd_ms": timing.ms,
        "fwd_bwd_p20_ms": timing.p20_ms,
        "fwd_bwd_p80_ms": timing.p80_ms,
        "reps": timing.reps,
    }


def time_copy(n_bytes: int, device: str, graphed: bool = False) -> dict:
    """The bandwidth ceiling: one device-to-device copy reading and writing n_bytes in all."""
    src = torch.empty(n_bytes // 2, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)

    def call():
        return dst.copy_(src)

    if graphed:
        call = graph_replay(call)
        call()  # captured here
        dst.fill_(0)  # poisoned: the replay below must write every byte
        call()
        if not torch.equal(dst, src):
            raise AssertionError("the replayed copy did not reproduce its source")
    return timing_columns(call)


def check_and_time_graphed(fn, params: torch.Tensor, y: torch.Tensor, grad_loss: torch.Tensor) -> dict:
    """fn's forward+backward as a CUDA-graph replay: checked on fresh inputs, then timed."""
    replay = graph_replay(lambda: torch.autograd.grad(fn(params, y), (params,), grad_loss))
    (d_params,) = replay()  # warm-up, capture and one replay; the gradient lives in the graph's pool
    with torch.no_grad():  # new values in the buffers the graph reads, and a gradient it must overwrite
        params.normal_()
        y.normal_()
        d_params.fill_(float("nan"))
    replay()
    ref_params = params.detach().float().requires_grad_()
    (ref,) = torch.autograd.grad(baseline.gmm_nll(ref_params, y), (ref_params,), grad_loss)
    err = sweep.rel_err(d_params, ref)
    if not err <= GRAPHED_GRAD_TOLERANCE:  # NaN fails too
        raise AssertionError(
            f"replayed gradient differs from the float32 reference by {err:.3g} > {GRAPHED_GRAD_TOLERANCE}"
        )
    return {"err_grad": err, **timing_columns(replay)}


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
        modes = ["autograd", "graphed"] if shape_name in args.graphed_on else ["autograd"]
        for name in args.variants:
            sizes = {"targets": T, "n_components": n_components, "bytes": min_bytes}
            for mode in modes:
                cell = {**sweep.sweep_cell(name, shape_name, dtype, **sizes), "mode": mode}
                if name == "copy":
                    measure = partial(time_copy, min_bytes, device, graphed=mode == "graphed")
                elif mode == "graphed":
                    measure = partial(check_and_time_graphed, fns[name], params, y, grad_loss)
                else:
                    measure = partial(
                        sweep.check_and_measure, fns[name], baseline.gmm_nll, [params, y], grad_loss
                    )
                result = sweep.run_cell(writer, cell, 8, measure)
                if result is None:
                    continue
                gbps = min_bytes / (result["fwd_bwd_ms"] * 1e-3) / 1e9
                writer.write({**cell, **result, "fwd_bwd_gbps": gbps})
                replay = "graph replay" if mode == "graphed" else ""
                times = (
                    f"fwd {result['fwd_ms']:8.4f}  bwd {result['bwd_ms']:8.4f}  "
                    if "fwd_ms" in result
                    else f"{replay:34s}"
                )
                errors = "".join(f"  {k} {result[k]:.1e}" for k in ("err_out", "err_grad") if k in result)
                print(f"  {name:8s} {times}fwd+bwd {result['fwd_bwd_ms']:8.4f} ms  {gbps:7.1f} GB/s{errors}")
    sweep.finish_sweep(writer)


if __name__ == "__main__":
    main()
