"""Side-by-side attention measurements, shared by phases 02, 03 and 04.

A *case* is one attention problem: the TransformerNP shapes (Lq = M+N queries over Lk = M keys,
H = 8 heads of D = 64, phase 01's batch sizes) or a point of the Lk sweep. For each case every
implementation is checked against SDPA first, then timed with ``common.bench`` in the same
process, and one CSV row is written per (implementation, case) -- a failure or an OOM too.
"""

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from common import (
    DEVICE,
    ON_GPU,
    SHAPES,
    ResultWriter,
    bench,
    failure_row,
    graph_replay,
    measure_peak_memory,
    resolve_shape,
)

HEADS, HEAD_DIM = 8, 64
SWEEP_LK = (1_000, 3_000, 10_000, 30_000, 100_000, 200_000)
# The sweep keeps B·H·Lq near the large shape's 8 × 205 000 query rows, so every point fills the
# GPU and the work grows linearly with Lk; H stays 8 and B absorbs the rest.
SWEEP_QUERY_ROWS = 8 * 220_000
TOLERANCE = 1e-2  # max abs error against SDPA in bf16, from the spec
GRAD_TOLERANCE = 3e-2  # max abs error of dq, dk, dv relative to the largest SDPA gradient
# bf16 on the GPU; fp16 on the CPU, where the interpreter's bf16 dots are wrong.
DTYPE = torch.bfloat16 if ON_GPU else torch.float16
SDPA = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-flash": SDPBackend.FLASH_ATTENTION}


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    lq: int
    lk: int
    heads: int = HEADS
    head_dim: int = HEAD_DIM

    def forward_flops(self) -> float:
        return 4.0 * self.batch * self.heads * self.lq * self.lk * self.head_dim

    def as_row(self) -> dict:
        return {
            "shape": self.name,
            "batch": self.batch,
            "heads": self.heads,
            "lq": self.lq,
            "lk": self.lk,
            "head_dim": self.head_dim,
        }


def parse_args(prog: str, doc: str, argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    parser.add_argument(
        "--shape",
        nargs="+",
        default=None,
        help=f"TNP shapes, of {', '.join(SHAPES)} (default: small mid large on a GPU, tiny on the CPU)",
    )
    parser.add_argument(
        "--sweep", action="store_true", help="also sweep Lk over 1 000 ... 200 000, Lq = 1.1 Lk"
    )
    parser.add_argument("--sweep-lk", nargs="+", type=int, default=None, help="the sweep's Lk values")
    parser.add_argument("--no-report", action="store_true", help="skip re-rendering the markdown report")
    args = parser.parse_args(argv)
    names = args.shape or (["small", "mid", "large"] if ON_GPU else ["tiny"])
    args.cases = [tnp_case(resolve_shape(n)) for n in names]
    if args.sweep or args.sweep_lk:
        lks = args.sweep_lk or (SWEEP_LK if ON_GPU else (40, 90))
        if any(lk < 1 for lk in lks):
            parser.error(f"--sweep-lk: every Lk must be >= 1, got {lks}")
        args.cases += [sweep_case(lk) for lk in lks]
    return args


def tnp_case(shape) -> Case:
    return Case(shape.name, shape.batch, shape.m_context + shape.n_target, shape.m_context)


def sweep_case(lk: int) -> Case:
    lq = round(1.1 * lk)
    rows = SWEEP_QUERY_ROWS if ON_GPU else 2 * lq
    return Case(f"sweep-Lk{lk}", max(1, round(rows / (HEADS * lq))), lq, lk)


def make_inputs(case: Case, dtype: torch.dtype, grad: bool, seed: int = 0):
    """q, k, v as phase 01's model makes them: strided views of (B, L, H·D) projections."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    B, H, D = case.batch, case.heads, case.head_dim
    q = torch.randn(B, case.lq, H * D, device=DEVICE, dtype=dtype, generator=g)
    kv = torch.randn(B, case.lk, 2 * H * D, device=DEVICE, dtype=dtype, generator=g)
    q = q.view(B, case.lq, H, D).transpose(1, 2)
    kv = kv.view(B, case.lk, 2, H, D)
    k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
    if grad:
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    do = torch.randn(B, case.lq, H * D, device=DEVICE, dtype=dtype, generator=g).view(B, case.lq, H, D)
    return q, k, v, do.transpose(1, 2)


def sdpa(backend: SDPBackend) -> Callable:
    def attend(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v)

    return attend


def reference_backend() -> SDPBackend:
    return SDPBackend.CUDNN_ATTENTION if ON_GPU else SDPBackend.MATH


def run_case(fn, q, k, v, do, backward: bool):
    """One call: the forward output, and with ``backward`` the three input gradients too."""
    o = fn(q, k, v)
    if isinstance(o, tuple):
        o = o[0]
    if not backward:
        return (o,)
    return (o, *torch.autograd.grad(o, (q, k, v), do))


def max_errors(ours, ref) -> dict:
    names = ("o", "dq", "dk", "dv")
    row = {}
    for name, a, b in zip(names, ours, ref, strict=False):
        row[f"err_{name}"] = (a.float() - b.float()).abs().max().item()
        row[f"relerr_{name}"] = row[f"err_{name}"] / max(b.float().abs().max().item(), 1e-6)
    return row


def measure(
    writer: ResultWriter,
    variants: dict[str, Callable],
    cases: list[Case],
    *,
    backward: bool,
    dtype: torch.dtype = DTYPE,
    config_of: Callable[[str], dict] | None = None,
    graphed: bool = False,
) -> None:
    """Check each variant against the reference backend, then time it; one row per cell.

    With ``graphed`` every variant's call is captured once in a CUDA graph and timed as a replay:
    no host work per call, so a shape whose calls are bound by the host (the small one) compares
    the kernels themselves -- what a training step captured in a graph gets.
    """
    dtype_name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
    mode = ("fwd+bwd" if backward else "fwd") + (" graphed" if graphed else "")
    for case in cases:
        meta = {"dtype": dtype_name, "mode": mode, **case.as_row()}
        try:
            inputs = make_inputs(case, dtype, backward)
            ref = [t.detach() for t in run_case(sdpa(reference_backend()), *inputs, backward)]
        except Exception as err:
            for variant in variants:
                writer.write({"variant": variant, **meta, **failure_row(err)})
            print(f"  {case.name}: reference failed: {err}")
            continue
        for variant, fn in variants.items():

            def call(fn=fn, inputs=inputs):
                return run_case(fn, *inputs, backward)

            cell = {"variant": variant, **meta}
            _measure_cell(
                writer, cell, case, graph_replay(call) if graphed else call, ref, backward, config_of
            )
        del inputs, ref
        if ON_GPU:
            torch.cuda.empty_cache()


def _measure_cell(writer, cell, case, call, ref, backward, config_of) -> None:
    large = case.lq * case.lk * case.batch * case.heads > 2e10
    budget = {"warmup_ms": 1.0, "rep_ms": 1.0} if large else {"warmup_ms": 25.0, "rep_ms": 150.0}
    try:
        call()  # compiles and autotunes, so the peak below is one call's
        with measure_peak_memory() as mem:
            errors = max_errors([t.detach() for t in call()], ref)
        if errors["err_o"] > TOLERANCE or not all(e == e for e in errors.values()):  # NaN fails too
            raise AssertionError(f"output differs from SDPA by {errors['err_o']:.3g} > {TOLERANCE}")
        worst_grad = max(
            (errors[f"relerr_{g}"] for g in ("dq", "dk", "dv") if f"relerr_{g}" in errors), default=0
        )
        if worst_grad > GRAD_TOLERANCE:
            raise AssertionError(
                f"gradients differ from SDPA by {worst_grad:.3g} (relative) > {GRAD_TOLERANCE}"
            )
        timing = bench(call, **budget)
    except Exception as err:  # a failed cell is a row, and the sweep goes on
        row = writer.write({**cell, **failure_row(err)})
        print(f"  {cell['variant']:18s} {case.name:14s} {row['status']}: {row['error'][:100]}")
        if ON_GPU:
            torch.cuda.empty_cache()
        return
    flops = (3.5 if backward else 1.0) * case.forward_flops()  # backward = 2.5 × the forward
    tflops = flops / (timing.ms * 1e-3) / 1e12
    extra = config_of(cell["variant"]) if config_of else {}
    # peak_mem_gb is the device's peak (inputs included); call_mem_gb what the call itself added.
    call_gb = (mem.peak_bytes - mem.start_bytes) / 1e9
    writer.write(
        {
            **cell,
            **timing.as_row(),
            "tflops": tflops,
            "peak_mem_gb": mem.peak_gb,
            "call_mem_gb": call_gb,
            **errors,
            **extra,
        }
    )
    print(
        f"  {cell['variant']:18s} {case.name:14s} B={case.batch:<4d} Lq={case.lq:<7d} Lk={case.lk:<7d} "
        f"{timing.ms:9.3f} ms {tflops:7.1f} TFLOP/s  err {errors['err_o']:.1e}  "
        f"peak {mem.peak_gb:.2f} GB  {extra.get('config', '')}"
    )


def sdpa_variants() -> dict[str, Callable]:
    return {name: sdpa(backend) for name, backend in SDPA.items()} if ON_GPU else {}
