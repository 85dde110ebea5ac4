"""The profile, memory and compile parts of lm_bench: several rows per measured model.

Each job builds one model and returns a list of rows (a profile's top kernels, the timed modes of a
compiled model); a job that fails -- an out-of-memory included -- is one row with its status and
error, and the sweep goes on. Rows a machine cannot measure (peak memory and snapshots on the CPU)
are rows with status "skipped" and the reason.
"""

import pickle
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from common import DEVICE, ON_GPU, measure_peak_memory
from common.report import reports_dir
from common.results import ResultWriter, failure_row
from common.timing import cuda_kernel_events, nvtx_range
from tritonlab.models import HEADS, LM_SIZES, TransformerLM, lm_config, param_count, random_batch

from .bench import (  # the step and its parts, shared with the timed cells: a declaration, not logic
    Plan,
    adamw,
    autocast,
    compile_mode,
    components_for,
    make_step,
    skip_reason,
    step_row,
    sync,
    time_steps,
)

PROFILE_MODES = ("forward", "train")
# What the profile part can trace kernel by kernel: eager launches or the default compile (the graphed
# variants replay one CUDA graph; "mixed" is mixed+graphs' components launched eagerly, the same kernels).
PROFILE_VARIANTS = ("eager-naive", "eager-sdpa", "compile-sdpa", "ours", "mixed")
CPU_SKIP = "no CUDA GPU: the CPU has no caching allocator to ask for peaks or record a history of"


@dataclass
class Job:
    """Key columns shared by its rows, and ``run() -> list[dict]``."""

    key: dict
    run: Callable[[], list[dict]]


def run_jobs(writer: ResultWriter, jobs: Iterator[Job], on_row=None) -> list[dict]:
    rows = []
    for job in jobs:
        try:
            results = job.run()
        except Exception as err:  # a failed job is a row, and the sweep goes on
            results = [failure_row(err)]
        if ON_GPU:
            torch.cuda.empty_cache()
        for result in results:
            row = writer.write({**job.key, **result})
            rows.append(row)
            if on_row:
                on_row(row)
    return rows


def _key(
    part: str, variant: str, size: str, context: int, mode: str, dtype: str, batch: int, **extra
) -> dict:
    return {
        "variant": variant,
        "shape": size,
        "dtype": dtype,
        "part": part,
        "size": size,
        "context": context,
        "mode": mode,
        "batch": batch,
        "params": param_count(LM_SIZES[size]),
        **extra,
    }


def _build(size: str, context: int, variant: str = "eager-naive") -> TransformerLM:
    torch.manual_seed(0)
    with DEVICE:
        return TransformerLM(lm_config(size, context), components_for(variant))


# --- profile ---------------------------------------------------------------------------------------


def ranged_step(
    model: TransformerLM, mode: str, dtype: str, batch: int, context: int, optimizer: str = "foreach"
) -> Callable[[], None]:
    """One step of ``mode`` with NVTX ranges (and profiler ranges) around forward, backward and the
    optimizer step (``optimizer``: which AdamW)."""
    tokens, targets = random_batch(model.cfg, batch, context, device=DEVICE)
    optimizer = adamw(model, optimizer) if mode == "train" else None

    def stage(name: str):
        return _Both(name)

    def step() -> None:
        if mode == "forward":
            with stage("forward"), torch.no_grad(), autocast(dtype):
                model.loss(tokens, targets)
            return
        with stage("forward"), autocast(dtype):
            loss = model.loss(tokens, targets)
        with stage("backward"):
            loss.backward()
        if optimizer is not None:
            with stage("optimizer step"):
                optimizer.step()
        model.zero_grad(set_to_none=True)

    return step


class _Both:
    """An NVTX range (GPU only) and a torch.profiler range of the same name."""

    def __init__(self, name: str):
        self.nvtx, self.rf = nvtx_range(name), torch.profiler.record_function(name)

    def __enter__(self):
        self.nvtx.__enter__()
        self.rf.__enter__()

    def __exit__(self, *exc):
        self.rf.__exit__(*exc)
        return self.nvtx.__exit__(*exc)


def _device_ms(evt) -> float:
    return getattr(evt, "device_time_total", getattr(evt, "cuda_time_total", 0.0)) / 1e3


def _self_device_ms(evt) -> float:
    return getattr(evt, "self_device_time_total", getattr(evt, "self_cuda_time_total", 0.0)) / 1e3


def kernel_table(events, top: int | None) -> list[dict]:
    """The top ``top`` CUDA kernels by total time (on the CPU: CPU ops by self time; None: all), each
    with its share of the profile's total."""
    if ON_GPU:
        timed = [(e.key, e.count, _self_device_ms(e)) for e in cuda_kernel_events(events)]
        what = "cuda kernel"
    else:
        timed = [(e.key, e.count, e.self_cpu_time_total / 1e3) for e in events if e.key.startswith("aten::")]
        what = "cpu op (no GPU: CPU time, not kernels)"
    total = sum(ms for _, _, ms in timed) or float("nan")
    timed.sort(key=lambda t: -t[2])
    return [
        {
            "rank": i + 1,
            "kind": what,
            "kernel": name[:200],
            "calls": calls,
            "total_ms": ms,
            "share": ms / total,
        }
        for i, (name, calls, ms) in enumerate(timed[:top])
    ]


def attention_flops(cfg, batch: int, context: int) -> dict:
    """Forward FLOPs of the naive attention of all layers: each matmul (scores q kᵀ, weighted sum
    P v) is 2·B·H·T²·D; the softmax (max, subtract, exp, sum, divide) ~5·B·H·T² (masking not counted)."""
    bht2 = batch * cfg.n_heads * context * context * cfg.n_layers
    return {"matmul": 2 * 2 * bht2 * cfg.head_dim, "softmax": 5 * bht2}


def attention_rows(events, cfg, batch: int, context: int, steps: int) -> list[dict]:
    """Attention's softmax against its two matmuls, read from the forward profile: the batched
    matmuls (aten::bmm; the model's linear layers are aten::mm) and aten::_softmax (the loss's is
    _log_softmax). Times are per step; FLOPs analytic."""
    by_name = {e.key: e for e in events}
    flops = attention_flops(cfg, batch, context)
    rows = []
    for what, op in (("matmul", "aten::bmm"), ("softmax", "aten::_softmax")):
        evt = by_name.get(op)
        if evt is None:
            rows.append({"component": what, "op": op, "status": "error", "error": f"{op} not in the profile"})
            continue
        ms = (_device_ms(evt) if ON_GPU else evt.cpu_time_total / 1e3) / steps
        rows.append(
            {
                "component": what,
                "op": op,
                "calls": evt.count // steps,
                "total_ms": ms,
                "flops": flops[what],
                "tflops": flops[what] / (ms * 1e-3) / 1e12 if ms > 0 else float("nan"),
                "time_clock": "cuda" if ON_GPU else "cpu",
            }
        )
    return rows


def profile_one(size, context, mode, dtype, batch, warmup, steps, top, variant, optimizer) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    reason = skip_reason(variant, mode)
    if reason:
        return [{"status": "skipped", "error": reason}]
    model = _build(size, context, variant)
    if compile_mode(variant):
        torch._dynamo.reset()
        model.loss = torch.compile(model.loss)  # compiled by the first warm-up step
        warmup = max(warmup, 1)
    step = ranged_step(model, mode, dtype, batch, context, optimizer)
    for _ in range(warmup):
        step()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ON_GPU else [])
    with profile(activities=activities, record_shapes=False) as prof:
        for _ in range(steps):
            step()
        sync()
    events = prof.key_averages()
    every = kernel_table(events, top=None)
    rows = [{"table": "kernels", **r, "ms_per_step": r["total_ms"] / steps} for r in every[:top]]
    total_ms = sum(r["total_ms"] for r in every)
    rows.append({"table": "total", "kernel": "all", "calls": sum(r["calls"] for r in every) / steps,
                 "total_ms": total_ms, "ms_per_step": total_ms / steps})  # fmt: skip
    if mode == "forward":
        rows += [
            {"table": "attention", **r} for r in attention_rows(events, model.cfg, batch, context, steps)
        ]
    return rows


def profile_jobs(
    sizes, contexts, modes, dtypes, *, batch, warmup, steps, top, nvtx_attention,
    variants=("eager-naive",), optimizer="foreach",
) -> Iterator[Job]:  # fmt: skip
    for dtype in dtypes:
        for size in sizes:
            for context in contexts:
                for mode in modes:
                    for variant in variants:
                        # The ranges inside naive attention come with a component of their own: the
                        # default path stays as is.
                        built = (
                            f"{variant}-ranges" if nvtx_attention and variant == "eager-naive" else variant
                        )
                        key = _key("profile", variant, size, context, mode, dtype, batch, warmup=warmup,
                                   steps=steps, nvtx_attention=nvtx_attention,
                                   optimizer=optimizer if mode == "train" else "none")  # fmt: skip
                        yield Job(
                            key,
                            lambda a=(size, context, mode, dtype, batch, warmup, steps, top, built): (
                                profile_one(*a, optimizer)
                            ),
                        )


# --- memory ----------------------------------------------------------------------------------------


def residual_derivation(size: str, context: int, dtype: str, batch: int) -> list[dict]:
    """One residual-stream tensor (the output of the first block, (B, T, d_model)): its size derived
    as B·T·d_model·bytes against the measured size of the tensor (its storage's bytes; on a GPU also
    the allocator's growth when the block's output is made)."""
    model = _build(size, context)
    tokens, _ = random_batch(model.cfg, batch, context, device=DEVICE)
    seen = {}

    def hook(_module, _inputs, output):
        seen["tensor"] = (
            output[0] if isinstance(output, tuple) else output
        )  # a block passes on (stream, FFN output)
        if ON_GPU:
            seen["allocated_after"] = torch.cuda.memory_allocated()

    handle = model.layers[0].register_forward_hook(hook)
    try:
        with torch.no_grad(), autocast(dtype):
            model(tokens)
    finally:
        handle.remove()
    t = seen["tensor"]
    d = model.cfg.d_model
    derived = batch * context * d * t.element_size()
    measured = t.untyped_storage().nbytes()
    row = {
        "table": "derivation",
        "tensor": "residual stream after block 0",
        "tensor_dtype": str(t.dtype).removeprefix("torch."),
        "tensor_shape": "x".join(map(str, t.shape)),
        "formula": f"{batch}·{context}·{d}·{t.element_size()}",
        "derived_bytes": derived,
        "measured_bytes": measured,
        "derived_mb": derived / 2**20,
        "matches": derived == measured,
    }
    if derived != measured:
        raise AssertionError(f"residual stream: derived {derived} bytes, measured {measured}")
    return [row]


def peak_one(size, context, mode, dtype, batch, head="logits") -> list[dict]:
    """Peak allocated bytes of one step (model, optimizer state and activations included) after a
    warm-up step, with the output layer and the loss apart (``head`` "logits") or fused
    ("fused": no full logits); on the CPU a "skipped" row."""
    if not ON_GPU:
        return [{"table": "peak", "status": "skipped", "error": f"peak memory: {CPU_SKIP}"}]
    variant = "eager-naive" + ("+flce" if head == "fused" else "")
    with measure_peak_memory() as mem:
        model = _build(size, context, variant)
        step = make_step(model, Plan(variant, size, context, mode, dtype, batch, 1, 1))
        step()
        step()
    return [{"table": "peak", "peak_mem_gb": mem.peak_gb, "peak_mem_gib": mem.peak_bytes / 2**30}]


def snapshot_dir() -> Path:
    return reports_dir() / "lm_bench_memory"


def snapshot_one(size, context, mode, dtype, batch) -> list[dict]:
    """A ``torch.cuda.memory._record_memory_history`` snapshot of one step (after a warm-up step, so
    the optimizer state exists), pickled for https://pytorch.org/memory_viz, and its active-memory
    timeline drawn as a PNG; on the CPU a "skipped" row."""
    if not ON_GPU:
        return [{"table": "snapshot", "status": "skipped", "error": f"memory snapshot: {CPU_SKIP}"}]
    # The GPU in the name: runs on two GPU models must not overwrite each other's files (the traces
    # may differ, and each GPU's section of the report shows its own).
    gpu = re.sub(r"[^a-z0-9]+", "_", torch.cuda.get_device_name().lower()).strip("_")
    name = f"lm_bench_memory_{gpu}_{size}_ctx{context}_{mode}_{dtype}"
    model = _build(size, context)
    step = make_step(model, Plan("eager-naive", size, context, mode, dtype, batch, 1, 1))
    step()
    sync()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    try:
        step()
        sync()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    out = snapshot_dir()
    out.mkdir(parents=True, exist_ok=True)
    pickle_path = out / f"{name}.pickle"
    with open(pickle_path, "wb") as f:
        pickle.dump(snapshot, f)
    png = reports_dir() / "figures" / f"{name}.png"
    peak = draw_timeline(snapshot, png, f"{size}, context {context}, {mode}, {dtype}: active memory")
    return [
        {
            "table": "snapshot",
            "snapshot": str(pickle_path.relative_to(reports_dir())),
            "timeline_png": str(png.relative_to(reports_dir())),
            "trace_peak_gib": peak / 2**30,
        }
    ]


def active_timeline(snapshot: dict, device: int = 0) -> tuple[list[int], list[int]]:
    """Bytes allocated (active) after each traced event: allocations present when recording began
    (read from the segments at the end, less the trace's net change), then +size per ``alloc`` and
    -size per ``free_completed``."""
    trace = snapshot["device_traces"][device] if snapshot.get("device_traces") else []
    at_end = sum(
        b["size"]
        for seg in snapshot.get("segments", [])
        if seg.get("device", device) == device
        for b in seg.get("blocks", [])
        if b.get("state") == "active_allocated"
    )
    deltas = [
        e["size"] if e["action"] == "alloc" else -e["size"]
        for e in trace
        if e["action"] in ("alloc", "free_completed")
    ]
    level = max(at_end - sum(deltas), 0)
    xs, ys = [0], [level]
    for i, d in enumerate(deltas, 1):
        level += d
        xs.append(i)
        ys.append(level)
    return xs, ys


def draw_timeline(snapshot: dict, path: Path, title: str) -> int:
    """The active-memory timeline as a PNG at ``path``; returns its peak in bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs, ys = active_timeline(snapshot)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(xs, [y / 2**30 for y in ys], lw=1)
    ax.set(title=title, xlabel="allocator event", ylabel="active memory (GiB)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return max(ys)


def memory_jobs(sizes, contexts, modes, dtypes, *, batch, snapshot_context) -> Iterator[Job]:
    """Per size and dtype: the residual-stream derivation (first context), the snapshots of each mode
    at ``snapshot_context``, then the peak of each context x mode, with the output layer and the loss
    apart and fused (what the fused linear cross-entropy saves)."""
    for dtype in dtypes:
        for size in sizes:
            key = _key("memory", "derivation", size, contexts[0], "forward", dtype, batch)
            yield Job(key, lambda a=(size, contexts[0], dtype): residual_derivation(*a, batch))
            for mode in modes:
                key = _key("memory", "snapshot", size, snapshot_context, mode, dtype, batch)
                yield Job(key, lambda a=(size, snapshot_context, mode, dtype): snapshot_one(*a, batch))
            for context in contexts:
                for mode in modes:
                    for head in HEADS:
                        key = _key("memory", "peak", size, context, mode, dtype, batch, head=head)
                        yield Job(key, lambda a=(size, context, mode, dtype, batch, head): peak_one(*a))


# --- compile ---------------------------------------------------------------------------------------


def compile_one(size, context, modes, dtype, variant, batch, warmup, steps) -> list[dict]:
    """One model, eager or with its loss (forward and cross-entropy) under ``torch.compile``; each
    mode's first call (the compile, for compiled) timed alone, then ``warmup`` untimed and ``steps``
    timed steps. AdamW is the same eager step in both."""
    if variant == "compiled":
        torch._dynamo.reset()  # a fresh model must not hit the recompile limit and fall back to eager
    with measure_peak_memory() as mem:
        model = _build(size, context)
        if variant == "compiled":
            model.loss = torch.compile(model.loss)
        rows = []
        for mode in modes:
            plan = Plan(variant, size, context, mode, dtype, batch, warmup, steps)
            step = make_step(model, plan)
            sync()
            started = time.perf_counter()
            step()
            sync()
            first_call_ms = (time.perf_counter() - started) * 1e3
            times = time_steps(step, warmup, steps)
            rows.append({"mode": mode, **step_row(times, plan), "first_call_ms": first_call_ms})
    for row in rows:
        row["peak_mem_gb"] = mem.peak_gb
    return rows


def compile_jobs(sizes, contexts, modes, dtypes, *, batch, warmup, steps) -> Iterator[Job]:
    for dtype in dtypes:
        for size in sizes:
            for context in contexts:
                for variant in ("eager", "compiled"):
                    key = _key(
                        "compile", variant, size, context, "", dtype, batch, warmup=warmup, steps=steps
                    )
                    yield Job(
                        key,
                        lambda a=(size, context, modes, dtype, variant): compile_one(
                            *a, batch, warmup, steps
                        ),
                    )
