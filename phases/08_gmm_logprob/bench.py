"""Phase 08's cells: the mixture NLL at each shape's target count and any extra row count, every
variant, through autograd and as CUDA-graph replays.

Variants, side by side in one run:
- eager: ``tritonlab.models.gmm_nll`` (log_softmax, logsumexp and a dozen elementwise kernels each way),
- compile: the same under ``torch.compile``,
- fused: ``tritonlab.gmm.gmm_nll`` (forward writes the scalar, backward writes d params),
- copy: a device-to-device copy moving the same number of bytes as the fused forward+backward's
  minimum traffic (params and y read twice, d params written once) -- the bandwidth ceiling.
GB/s counts that minimum traffic for every variant.

Modes (the ``mode`` column):
- autograd: forward and ``autograd.grad`` called from Python, as an eager training step runs them;
- graphed: the same forward+backward captured once in a CUDA graph and timed as replays, as a
  graphed training step runs them. At the model's token counts the autograd calls are bound by the
  host's time (~0.2 ms for 5-10 µs of kernels); a replay has no host work per call, so it compares
  the kernels. The replay is checked first: fresh inputs in the buffers the graph reads, a poisoned
  gradient, against a float32 reference.
"""

from collections.abc import Iterator

import torch

from common import ON_GPU, Cell, bench, check_close, graph_replay
from common.fwd_bwd import BENCH, dtype_column, fwd_bwd_cell
from tritonlab.gmm import gmm_nll
from tritonlab.models import gmm_nll as gmm_nll_eager
from tritonlab.models import resolve_shape
from tritonlab.testing import rel_err

N_COMPONENTS = 10
VARIANTS = ("eager", "compile", "fused", "copy")
# A replayed gradient must match the float32 reference as closely as a plain call's does: bf16
# rounds it once on the way out (the autograd rows read ~1.7e-3).
GRAPHED_GRAD_TOLERANCE = 1e-2


def variant_fn(name: str):
    return {
        "eager": lambda: gmm_nll_eager,
        "compile": lambda: torch.compile(gmm_nll_eager, dynamic=False),
        "fused": lambda: gmm_nll,
    }[name]()


def timing_columns(fn) -> dict:
    timing = bench(fn, **BENCH)
    return {
        "fwd_bwd_ms": timing.ms,
        "fwd_bwd_p20_ms": timing.p20_ms,
        "fwd_bwd_p80_ms": timing.p80_ms,
        "reps": timing.reps,
    }


def time_copy(n_bytes: int, device, graphed: bool = False) -> dict:
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
    (ref,) = torch.autograd.grad(gmm_nll_eager(ref_params, y), (ref_params,), grad_loss)
    err = rel_err(d_params, ref)
    check_close("replayed gradient vs float32", err, GRAPHED_GRAD_TOLERANCE)
    return {"err_grad": err, **timing_columns(replay)}


def row_counts(shapes: list[str], rows: list[int]) -> list[tuple[str, int]]:
    """(cell name, targets): each shape's B·N targets, then each extra row count as "T=<rows>"."""
    return [(s, resolve_shape(s).batch * resolve_shape(s).n_target) for s in shapes] + [
        (f"T={r}", r) for r in rows
    ]


def cells(
    counts: list[tuple[str, int]], variants: list[str], dtype: torch.dtype, graphed_on: list[str]
) -> Iterator[Cell]:
    device = "cuda" if ON_GPU else "cpu"
    for shape, T in counts:
        torch.manual_seed(0)
        params = torch.randn(T, N_COMPONENTS, 3, device=device, dtype=dtype).requires_grad_()
        y = torch.randn(T, device=device)
        grad_loss = torch.ones((), device=device)
        param_bytes = params.numel() * params.element_size()
        min_bytes = 2 * (param_bytes + y.numel() * y.element_size()) + param_bytes
        sizes = {"targets": T, "n_components": N_COMPONENTS, "bytes": min_bytes}
        for variant in variants:
            for mode in ["autograd", "graphed"] if shape in graphed_on else ["autograd"]:
                if variant == "copy" or mode == "graphed":
                    yield _timed_only_cell(
                        variant, shape, dtype, sizes, mode, params, y, grad_loss, min_bytes
                    )
                else:
                    yield fwd_bwd_cell(
                        variant,
                        shape,
                        dtype,
                        sizes,
                        variant_fn(variant),
                        gmm_nll_eager,
                        [params, y],
                        grad_loss,
                        nbytes=min_bytes,
                        extra={"mode": mode},
                    )


def _timed_only_cell(variant, shape, dtype, sizes, mode, params, y, grad_loss, min_bytes) -> Cell:
    """The copy (either mode) and every graphed replay: forward+backward time only (and the replay's check)."""

    def run() -> dict:
        if variant == "copy":
            row = time_copy(min_bytes, params.device, graphed=mode == "graphed")
        else:
            row = check_and_time_graphed(variant_fn(variant), params, y, grad_loss)
        return {**row, "fwd_bwd_gbps": min_bytes / (row["fwd_bwd_ms"] * 1e-3) / 1e9}

    return Cell(variant, shape, dtype_column(dtype), run, {**sizes, "mode": mode})
