"""What phases 02, 03 and 04 measure alike: attention at the TransformerNP's shapes, side by side
with SDPA, as ``common.runner`` cells, and the report section they share.

A *case* is one attention problem: a TransformerNP shape (Lq = M+N queries over Lk = M keys, H = 8
heads of D = 64, the model's batch sizes) or a point of the Lk sweep. Inputs are made as the model
makes them: strided views of (B, L, H·D) projections. Each cell checks its implementation against
the reference SDPA backend (cuDNN on a GPU, the math backend on the CPU) and then times it; a cell
that fails or runs out of memory becomes a row saying so.

The three phases also share their command line (:func:`attention_parser`, :func:`parse_attention_args`;
02's and 03's whole script, :func:`attention_main`), their Nsight Compute pass
(:func:`profile_against_cudnn`) and their report (:func:`attention_report`); each adds its goals
and, 04, its own flags.
"""

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import pandas as pd
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tritonlab.models import SHAPES, resolve_shape
from tritonlab.testing import DTYPES
from tritonlab.tuning import ConfigRecord
from tritonlab.tuning_workloads import SWEEP_LK, SWEEP_QUERY_ROWS  # the sweep the tables are tuned at too

from .cli import parse_phase_args, phase_parser, phase_run, refuse_bf16_on_cpu
from .device import DEVICE, ON_GPU
from .memory import measure_peak_memory
from .ncu import pass_shape, profile_once, render_profile
from .report import (  # much the same list as other modules': a declaration, not logic
    Figures,
    PhaseReport,
    Verdict,
    add_speedup,
    best_baseline_verdict,
    failures_table,
    markdown_table,
    select_latest,
)
from .runner import Cell, check_close, run_cells, timed
from .timing import graph_replay

HEADS, HEAD_DIM = 8, 64
HEAD_DIMS = (64, 128)  # --head-dim: the model's, and the one most language models use
TNP_SHAPES = tuple(SHAPES)  # small, mid, large, tiny
GPU_SHAPES = ("small", "mid", "large")
CPU_SWEEP_LK = (40, 90)
CPU_MAX_LK = 1_000  # the interpreter's limit for --sweep-lk
TOLERANCE = 1e-2  # max abs error of the output against SDPA
GRAD_TOLERANCE = 3e-2  # max abs error of dq, dk, dv relative to the largest SDPA gradient
DTYPE_NAMES = ("bf16", "fp16", "fp32")
# bf16 on the GPU; fp16 on the CPU, where the interpreter's bf16 dots are wrong.
DEFAULT_DTYPE = "bf16" if ON_GPU else "fp16"
SDPA = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-flash": SDPBackend.FLASH_ATTENTION}
CONFIG_COLUMNS = {"forward": "config", "dkdv": "dkdv_config", "dq": "dq_config", "fused": "fused_config"}


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    lq: int
    lk: int
    heads: int = HEADS
    head_dim: int = HEAD_DIM

    @property
    def label(self) -> str:
        """The rows' shape: the name, with the head dim where it is not the model's (mid-d128)."""
        return self.name if self.head_dim == HEAD_DIM else f"{self.name}-d{self.head_dim}"

    def forward_flops(self) -> float:
        return 4.0 * self.batch * self.heads * self.lq * self.lk * self.head_dim

    def columns(self) -> dict:
        """The row's size columns, in this order."""
        return {name: getattr(self, name) for name in ("batch", "heads", "lq", "lk", "head_dim")}


def tnp_case(name: str) -> Case:
    shape = resolve_shape(name)
    return Case(shape.name, shape.batch, shape.m_context + shape.n_target, shape.m_context)


def sweep_case(lk: int) -> Case:
    lq = round(1.1 * lk)
    rows = SWEEP_QUERY_ROWS if ON_GPU else 2 * lq
    return Case(f"sweep-Lk{lk}", max(1, round(rows / (HEADS * lq))), lq, lk)


def attention_parser(phase: str, description: str):
    """The attention phases' parser: the TNP shapes (small, mid, large on a GPU; tiny on the CPU),
    bf16, fp16 or fp32, and :func:`add_case_arguments`' flags."""
    parser = phase_parser(
        phase, description, shapes=TNP_SHAPES, gpu_shapes=GPU_SHAPES, dtypes=DTYPE_NAMES,
        epilog="dtype default: bf16 on a GPU, fp16 on the CPU (the interpreter's bf16 dots are wrong)",
    )  # fmt: skip
    add_case_arguments(parser)
    return parser


def parse_attention_args(parser, argv=None):
    """Parse (``common.cli.parse_phase_args``) and put the run's cases in ``args.cases``."""
    args = parse_phase_args(parser, argv)
    args.cases = cases_from(parser, args)
    return args


def attention_main(
    phase: str, doc: str, cells: Callable[[list[Case], str], tuple[Iterator[Cell], int]], report, argv=None
) -> None:
    """The script of phases 02 and 03: :func:`attention_parser` (the first line of the phase's ``doc``
    its description), then ``cells(cases, dtype)``, the cells and their count, then ``report``."""
    args = parse_attention_args(attention_parser(phase, doc.strip().splitlines()[0]), argv)
    with phase_run(phase, report, no_report=args.no_report) as writer:
        phase_cells, total = cells(args.cases, args.dtype)
        run_cells(writer, phase_cells, total=total)


def add_case_arguments(parser) -> None:
    """--sweep and --sweep-lk, the flags every attention phase shares beyond the common ones."""
    parser.add_argument(
        "--sweep", action="store_true", help="also sweep Lk over 1 000 ... 200 000 at Lq = 1.1 Lk"
    )
    parser.add_argument(
        "--sweep-lk", nargs="+", type=int, default=None, metavar="LK",
        help=f"the sweep's Lk values (default {' '.join(map(str, SWEEP_LK))}; on the CPU "
        f"{' '.join(map(str, CPU_SWEEP_LK))}, at most {CPU_MAX_LK})",
    )  # fmt: skip
    parser.add_argument(
        "--head-dim", type=int, choices=HEAD_DIMS, default=HEAD_DIM,
        help=f"every case's head dim (default {HEAD_DIM}, the TransformerNP's); another keeps H·D = "
        f"{HEADS * HEAD_DIM} (fewer heads) and names the shapes with a suffix, e.g. mid-d128",
    )  # fmt: skip
    parser.set_defaults(dtype=DEFAULT_DTYPE)


def with_head_dim(case: Case, head_dim: int) -> Case:
    """``case`` at another head dim, the model width H·D kept: e.g. mid-d128 has 4 heads of 128."""
    return replace(case, heads=case.heads * case.head_dim // head_dim, head_dim=head_dim)


def cases_from(parser, args) -> list[Case]:
    """The TNP cases of ``--shape`` and the sweep's; a bad value is the parser's error."""
    refuse_bf16_on_cpu(parser, args.dtype)
    cases = [tnp_case(name) for name in args.shape]
    if args.sweep or args.sweep_lk:
        lks = args.sweep_lk or (SWEEP_LK if ON_GPU else CPU_SWEEP_LK)
        if any(lk < 1 for lk in lks):
            parser.error(f"--sweep-lk: every Lk must be >= 1, got {' '.join(map(str, lks))}")
        if not ON_GPU and max(lks) > CPU_MAX_LK:
            parser.error(
                f"--sweep-lk: at most {CPU_MAX_LK} in Triton's interpreter on the CPU, got {max(lks)}"
            )
        cases += [sweep_case(lk) for lk in lks]
    return [with_head_dim(case, args.head_dim) for case in cases]


def make_inputs(case: Case, dtype: torch.dtype, grad: bool, seed: int = 0):
    """q, k, v as the model makes them -- strided views of (B, L, H·D) projections -- and dO."""
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


def sdpa_variants() -> dict[str, Callable]:
    """SDPA's cuDNN and flash backends, side by side on a GPU (none in the interpreter)."""
    return {name: sdpa(backend) for name, backend in SDPA.items()} if ON_GPU else {}


def run_case(fn, q, k, v, do, backward: bool):
    """One call: the forward output, and with ``backward`` the three input gradients too."""
    o = fn(q, k, v)
    if isinstance(o, tuple):
        o = o[0]
    if not backward:
        return (o,)
    return (o, *torch.autograd.grad(o, (q, k, v), do))


def profile_against_cudnn(prog: str, ours: dict[str, Callable], *, backward: bool, argv=None) -> None:
    """An attention phase's ncu_pass: one call each of SDPA cuDNN and ``ours`` (name -> f(q, k, v))
    at the TransformerNP ``--shape`` (:func:`common.ncu.pass_shape`), on the benchmark's inputs in
    bf16, forward only or forward + backward, as :func:`common.ncu.profile_once` runs them."""
    shape = pass_shape(prog, argv)
    q, k, v, do = make_inputs(tnp_case(shape.name), DTYPES["bf16"], grad=backward)
    calls = {"sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), **ours}
    profile_once({name: functools.partial(run_case, fn, q, k, v, do, backward) for name, fn in calls.items()})


def max_errors(ours, ref) -> dict:
    row = {}
    for name, a, b in zip(("o", "dq", "dk", "dv"), ours, ref, strict=False):
        row[f"err_{name}"] = (a.float() - b.float()).abs().max().item()
        row[f"relerr_{name}"] = row[f"err_{name}"] / max(b.float().abs().max().item(), 1e-6)
    return row


def attention_cells(
    variants: dict[str, Callable],
    cases: list[Case],
    *,
    backward: bool,
    dtype: str,
    graphed: bool = False,
) -> Iterator[Cell]:
    """One cell per (case, variant), the case's inputs and reference built once for its cells.

    A variant whose name starts with ``triton`` is called with ``record=`` and its configs become
    columns (``config``, ``dkdv_config``, ``dq_config``, ``fused_config``, ``n_regs``, ``n_spills``).
    With ``graphed`` every call is captured once in a CUDA graph and timed as a replay: no host work
    per call, so a shape whose calls are bound by the host (small) compares the kernels themselves.
    """
    torch_dtype = DTYPES[dtype]
    mode = ("fwd+bwd" if backward else "fwd") + (" graphed" if graphed else "")
    for case in cases:

        @functools.cache
        def prepared(case=case):
            inputs = make_inputs(case, torch_dtype, backward)
            backend = SDPBackend.CUDNN_ATTENTION if ON_GPU and dtype != "fp32" else SDPBackend.MATH
            if ON_GPU and dtype == "fp32":
                backend = SDPBackend.EFFICIENT_ATTENTION  # cuDNN and flash take 16-bit inputs only
            ref = [t.detach() for t in run_case(sdpa(backend), *inputs, backward)]
            return inputs, ref

        for variant, fn in variants.items():
            run = functools.partial(_measure, case, variant, fn, prepared, backward, graphed)
            yield Cell(variant, case.label, dtype, run, {"mode": mode, **case.columns()})
        prepared.cache_clear()  # the case's tensors go before the next case's are made


def count_cells(variants, cases) -> int:
    return len(variants) * len(cases)


def _measure(case: Case, variant: str, fn, prepared, backward: bool, graphed: bool) -> dict:
    inputs, ref = prepared()
    record = ConfigRecord() if variant.startswith("triton") else None
    attend = functools.partial(fn, record=record) if record is not None else fn

    def call():
        return run_case(attend, *inputs, backward)

    call = graph_replay(call) if graphed and ON_GPU else call
    call()  # compiles and autotunes, so the peak below is one call's
    with measure_peak_memory() as mem:
        errors = max_errors([t.detach() for t in call()], ref)
    check_close("output against SDPA (max abs)", errors["err_o"], TOLERANCE)
    for g in ("dq", "dk", "dv"):
        if f"relerr_{g}" in errors:
            check_close(f"{g} against SDPA (relative to its largest)", errors[f"relerr_{g}"], GRAD_TOLERANCE)
    large = case.lq * case.lk * case.batch * case.heads > 2e10
    budget = {"warmup_ms": 25.0, "rep_ms": 150.0}
    if large or not ON_GPU:  # one call takes ~0.2 s at large; in the interpreter a call only has to run
        budget = {"warmup_ms": 1.0, "rep_ms": 1.0, "min_reps": 1}
    flops = (3.5 if backward else 1.0) * case.forward_flops()  # backward = 2.5 × the forward
    row = timed(call, flops=flops, **budget)
    # peak_mem_gb is the device's peak (inputs included); call_mem_gb what the call itself added.
    row.update(peak_mem_gb=mem.peak_gb, call_mem_gb=(mem.peak_bytes - mem.start_bytes) / 1e9, **errors)
    if record is not None:
        row.update({CONFIG_COLUMNS.get(k, k): _number(v) for k, v in record.picked.items()})
    return row


def _number(text: str):
    return int(text) if text.lstrip("-").isdigit() else text


# --- the report section phases 02, 03 and 04 share -------------------------------------------------

KEYS = ["variant", "shape", "dtype", "mode"]
MEASURED = ["ms", "tflops", "speedup_vs_sdpa_cudnn", "speedup_vs_sdpa_flash", "peak_mem_gb"]
TNP_COLUMNS = [
    "variant",
    "shape",
    "dtype",
    "mode",
    "batch",
    "lq",
    "lk",
    *MEASURED,
    "call_mem_gb",
    "err_o",
    "config",
]
SWEEP_COLUMNS = ["variant", "dtype", "batch", "lq", "lk", *MEASURED]
CONFIG_TABLE = [
    "variant",
    "shape",
    "dtype",
    "config",
    "dkdv_config",
    "dq_config",
    "fused_config",
    "n_regs",
    "n_spills",
]


def _present(columns: list[str], df: pd.DataFrame) -> list[str]:
    return [c for c in columns if c in df]


def with_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """``speedup_vs_sdpa_cudnn`` and ``speedup_vs_sdpa_flash``: the backend's time over the row's, in
    the same run group (rows before the rename had these as ``x_vs_cudnn``/``x_vs_flash``, computed
    here too, never stored)."""
    for base in SDPA:
        df = add_speedup(df, ["shape", "dtype", "mode"], base, "ms", f"speedup_vs_{base.replace('-', '_')}")
    return df


def render_attention(df: pd.DataFrame, fig: Figures, *, title: str) -> str:
    df = with_speedups(select_latest(df, KEYS))
    ok = df.loc[df["status"] == "ok"]
    parts = [
        f"## {title}: TransformerNP shapes (H = 8, D = 64; a -d128 suffix: 4 heads of D = 128)\n",
        "TFLOP/s count the forward as 4·B·H·Lq·Lk·D and the backward as 2.5× that; `speedup_vs_sdpa_*` "
        "is the SDPA backend's time over this row's, measured in the same run. `err_o` is the max "
        "abs error of the output against SDPA cuDNN, checked before timing (and, with a backward, "
        "dq, dk, dv within 3% of the largest SDPA gradient). `peak_mem_gb` is the device's peak "
        "during one call, inputs included -- and, in every row after a run's first, the 0.27 GB "
        "L2-flush buffer of the timer; `call_mem_gb` is what the call itself allocates. A mode ending in "
        "`graphed` times a replay of the same call captured in a CUDA graph, for every implementation "
        "alike: no host work per call, so it compares the kernels where the plain call is bound by the host.\n",
        markdown_table(
            ok.loc[ok["shape"].str.replace(r"-d\d+$", "", regex=True).isin(TNP_SHAPES)].sort_values(
                ["shape", "dtype", "ms"]
            ),
            _present(TNP_COLUMNS, df),
        ),
    ]
    sweep = ok.loc[ok["shape"].str.startswith("sweep")]
    for dtype, part in sweep.groupby("dtype"):
        parts += [
            f"\n## Sweep over Lk ({dtype}; Lq = 1.1·Lk, H = 8, B·H·Lq ≈ 1.76 M query rows)\n",
            fig.line_plot(
                part, x="lk", y="tflops", series="variant", name=f"sweep_tflops_{dtype}",
                title=f"{title}: TFLOP/s against Lk, {dtype}, Lq = 1.1·Lk, D = 64",
                xlabel="Lk (keys)", ylabel="TFLOP/s", logx=True,
            ),
            markdown_table(part.sort_values(["lk", "variant"]), _present(SWEEP_COLUMNS, part)),
        ]  # fmt: skip
    configs = ok.loc[ok["variant"].str.startswith("triton"), _present(CONFIG_TABLE, ok)]
    if not configs.empty:
        parts += ["\n## Autotuned configs chosen per shape\n", markdown_table(configs.drop_duplicates())]
    return "\n".join(parts) + failures_table(df)


def attention_verdicts(phase: str, df: pd.DataFrame, goals: list[tuple]) -> list[Verdict]:
    """goals: (our variant, shape, mode, goal ratio against the best SDPA backend) -> verdicts, in bf16
    (the dtype of the goals)."""
    verdicts = []
    for ours, shape, mode, goal in goals:
        verdict = best_baseline_verdict(
            phase, df, cell=f"{shape}, {mode}, bf16", where={"shape": shape, "mode": mode, "dtype": "bf16"},
            ours=ours, baselines=list(SDPA), goal=goal,
        )  # fmt: skip
        if verdict is not None:
            verdicts.append(verdict)
    return verdicts


def attention_report(phase: str, title: str, *, section: str, goals: list[tuple]):
    """The phase's ``PhaseReport``: :func:`render_attention` under ``section``, then the ncu profile
    against SDPA cuDNN, and :func:`attention_verdicts` of ``goals``."""

    def render(df: pd.DataFrame, fig: Figures) -> str:
        profile = render_profile(phase, df["gpu"].iloc[0], "sdpa-cudnn")
        return render_attention(df, fig, title=section) + profile

    def headline(df: pd.DataFrame) -> list[Verdict]:
        return attention_verdicts(phase, df, goals)

    return PhaseReport(phase, title, render, headline)
