"""Timing: medians and spread after warm-up, and per-stage times inside one training step.

On a GPU every interval is measured with CUDA events on the stream, so the host's
launch overhead is not mistaken for kernel time; on the CPU, ``time.perf_counter``.
"""

import contextlib
import cProfile
import functools
import io
import os
import pstats
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .device import ON_GPU


def compile_in_process() -> None:
    """Have torch.compile compile in this process instead of starting a pool of worker processes
    (one per core) that would compete with a benchmark's host thread; the committed rows were
    compiled this way. Entry points call it; it respects a value the caller already set."""
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


try:  # the `nvtx` package annotates with less overhead; the GPU image has only torch's binding
    import nvtx as _nvtx

    def _nvtx_context(name: str):
        return _nvtx.annotate(name)

except ImportError:  # pragma: no cover - depends on the machine

    def _nvtx_context(name: str):
        return torch.cuda.nvtx.range(name)


@dataclass
class CompileTally:
    """What Triton's compiler did inside a ``triton_compiles()`` block: kernels compiled (cache
    misses) and the seconds that took, kernels loaded from its on-disk cache, and the C launchers
    built (``launchers_built``, ``launcher_s``): Triton compiles one per kernel signature with the
    system's C compiler the first time a kernel runs on an empty cache, apart from the kernel's own
    compile, which its listener times."""

    compiled: int = 0
    compile_s: float = 0.0
    loaded: int = 0
    launchers_built: int = 0
    launcher_s: float = 0.0


@contextlib.contextmanager
def triton_compiles():
    """Count Triton's compilations inside the block (its compilation listener, Triton >= 3.4): a
    first call's time is mostly compiling on an empty cache, and this tells how much. Yields a
    ``CompileTally``; the listener that was set before is restored (and still called)."""
    from triton import knobs

    tally, previous = CompileTally(), knobs.compilation.listener

    def listen(*, src, metadata, metadata_group, times, cache_hit):
        if cache_hit:
            tally.loaded += 1
        else:
            tally.compiled += 1
            tally.compile_s += times.total / 1e6
        if previous is not None:
            previous(
                src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit
            )

    from triton.runtime import build

    default_build = build._build  # called by build.compile_module_from_src on a cache miss

    def timed_build(*args, **kwargs):
        start = time.perf_counter()
        try:
            return default_build(*args, **kwargs)
        finally:
            tally.launchers_built += 1
            tally.launcher_s += time.perf_counter() - start

    knobs.compilation.listener = listen
    build._build = timed_build
    try:
        yield tally
    finally:
        knobs.compilation.listener = previous
        build._build = default_build


def nvtx_range(name: str):
    """An NVTX range visible in Nsight Systems; a no-op without a GPU."""
    return _nvtx_context(name) if ON_GPU else contextlib.nullcontext()


@dataclass(frozen=True)
class Timing:
    """Milliseconds per call: the median and the 20th/80th percentiles over ``reps`` calls."""

    ms: float
    p20_ms: float
    p80_ms: float
    reps: int

    def as_row(self, prefix: str = "") -> dict:
        return {
            f"{prefix}ms": self.ms,
            f"{prefix}p20_ms": self.p20_ms,
            f"{prefix}p80_ms": self.p80_ms,
            f"{prefix}reps": self.reps,
        }


def cuda_kernel_events(events) -> list:
    """The GPU kernels among a profiler's ``key_averages()``: its CUDA entries, without the GPU-side
    entries of ``record_function`` ranges (ranges, not kernels; torch's own table drops them too)."""
    return [
        e
        for e in events
        if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
    ]


def cprofile_calls(call: Callable[[], object], calls: int) -> pstats.Stats:
    """``calls`` calls of ``call`` under cProfile, the GPU (if any) drained before and after: where a
    small call's host time goes (the diagnostics' view beside ``host_and_device_ms``)."""
    drain = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    drain()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    profiler.disable()
    drain()
    return pstats.Stats(profiler)


def top_functions(stats: pstats.Stats, order: str, limit: int) -> str:
    """pstats' table of the ``limit`` functions first by ``order`` ("tottime", "cumulative"), without
    its blank lines."""
    out = io.StringIO()
    stats.stream = out
    stats.sort_stats(order).print_stats(limit)
    return "\n".join(line for line in out.getvalue().splitlines() if line.strip())


def host_and_device_ms(fn: Callable, calls: int = 20) -> tuple[float, float]:
    """What one call costs the CPU (Python, autograd, launches; the GPU is not waited for) and the GPU
    (the sum of its kernels' durations, from the profiler). When the first is the larger, the cell is
    bound by the host, not by the kernels -- at small shapes, a CUDA graph or a compiled region would
    hide it. NaN where the profiler is not available."""
    if not ON_GPU:
        return float("nan"), float("nan")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host_ms = (time.perf_counter() - start) * 1e3 / calls
    torch.cuda.synchronize()
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        kernels = cuda_kernel_events(prof.key_averages())
        device_ms = sum(e.self_device_time_total for e in kernels) / 1e3 / calls
    except Exception:  # the profiler is optional evidence, never a reason to lose the cell
        device_ms = float("nan")
    return host_ms, device_ms


def summarize(samples_ms: list[float]) -> Timing:
    if len(samples_ms) == 1:  # one sample is its own median and spread
        return Timing(samples_ms[0], samples_ms[0], samples_ms[0], 1)
    deciles = statistics.quantiles(samples_ms, n=10, method="inclusive")
    return Timing(statistics.median(samples_ms), deciles[1], deciles[7], len(samples_ms))


class _Clock:
    """Start/stop pairs that read CUDA events on a GPU and the host clock elsewhere."""

    def __init__(self):
        self._pairs = []

    def start(self):
        if ON_GPU:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def stop(self, started, key="") -> None:
        ended = self.start()
        self._pairs.append((key, started, ended))

    def elapsed_ms(self) -> list[tuple[str, float]]:
        if ON_GPU:
            torch.cuda.synchronize()
            return [(key, a.elapsed_time(b)) for key, a, b in self._pairs]
        return [(key, (b - a) * 1e3) for key, a, b in self._pairs]


_L2_FLUSH: list[torch.Tensor] = []


def l2_flush_buffer() -> torch.Tensor:
    """The buffer :func:`bench` overwrites to empty the L2 cache (more than H100's 50 MB)."""
    if not _L2_FLUSH:
        _L2_FLUSH.append(torch.empty(256 * 2**20, dtype=torch.int8, device="cuda"))
    return _L2_FLUSH[0]


@functools.cache
def _gpu_sleep_cycles_per_ms() -> float:
    """How many cycles of ``torch.cuda._sleep`` make a millisecond on this GPU, measured once."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000)
    start.record()
    torch.cuda._sleep(10_000_000)
    stop.record()
    torch.cuda.synchronize()
    return 10_000_000 / start.elapsed_time(stop)


def bench_samples(
    fn: Callable[[], object],
    *,
    warmup_ms: float = 100.0,
    rep_ms: float = 500.0,
    min_reps: int = 3,
    max_reps: int = 500,
    flush_l2: bool = True,
    head_start_ms: float = 0.0,
) -> list[float]:
    """Time ``fn()`` after warm-up: the milliseconds of each timed call.

    One untimed call compiles and estimates the cost; the number of warm-up and timed calls then
    follows from the two time budgets, so a 10-second training step is run a few times and a
    20-microsecond kernel hundreds of times. On a GPU the L2 cache is flushed before each call.

    ``head_start_ms`` > 0 queues a GPU sleep that long before each timed call. The host then
    enqueues the call while the GPU sleeps, so the interval is the GPU's time for the call even
    where the host stalls for a moment. For calls whose time is the GPU's anyway: phase 06's
    forward+backward steps at ~1 ms read up to 1.7× their forward plus backward without it.
    Host-bound measurements must leave it at 0.
    """
    if ON_GPU:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if ON_GPU:
        torch.cuda.synchronize()
    estimate_ms = max((time.perf_counter() - t0) * 1e3, 1e-3)
    n_warmup = int(min(max(warmup_ms / estimate_ms, 1), 100))
    n_reps = int(min(max(rep_ms / estimate_ms, min_reps), max_reps))
    for _ in range(n_warmup):
        fn()
    clock = _Clock()
    sleep_cycles = int(head_start_ms * _gpu_sleep_cycles_per_ms()) if ON_GPU and head_start_ms > 0 else 0
    for _ in range(n_reps):
        if ON_GPU and flush_l2:
            l2_flush_buffer().zero_()
        if sleep_cycles:
            torch.cuda._sleep(sleep_cycles)
        started = clock.start()
        fn()
        clock.stop(started)
    return [ms for _, ms in clock.elapsed_ms()]


def bench(fn: Callable[[], object], **bench_kw) -> Timing:
    """``fn()``'s median and spread in milliseconds over :func:`bench_samples`' timed calls."""
    return summarize(bench_samples(fn, **bench_kw))


def bench_interleaved(
    fns: dict[str, Callable[[], object]], *, rounds: int = 3, **bench_kw
) -> dict[str, Timing]:
    """Each of ``fns`` timed in ``rounds`` rounds of :func:`bench_samples`, in alternating order
    (A B C, C B A, A B C, ...), the samples of all its rounds summarised together.

    For calls that hold the GPU at its power limit: the clock the card settles at drifts with the
    load of the seconds before (an H100 at 700 W ran 1350-1400 MHz), so such calls timed one after
    another differ by their order alone; in rounds every call meets the same drift.
    """
    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            samples[name] += bench_samples(fns[name], **bench_kw)
    return {name: summarize(times) for name, times in samples.items()}


class StageTimer:
    """Per-stage times inside a repeated region, e.g. forward / backward / optimizer of a step.

    ``with timer.stage("forward"): ...`` records events (and an NVTX range) around the stage;
    ``timer.summary()`` synchronizes once and returns the median milliseconds per stage over
    every step recorded, so timing adds no synchronization inside the step.
    """

    def __init__(self):
        self._clock = _Clock()

    @contextlib.contextmanager
    def stage(self, name: str):
        with nvtx_range(name):
            started = self._clock.start()
            yield
            self._clock.stop(started, name)

    def summary(self) -> dict[str, Timing]:
        per_stage = defaultdict(list)
        for name, ms in self._clock.elapsed_ms():
            per_stage[name].append(ms)
        return {name: summarize(samples) for name, samples in per_stage.items()}


def graph_replay(call: Callable[[], tuple]) -> Callable[[], tuple]:
    """``call`` captured in a CUDA graph on its first use; each later use replays the graph.

    The first use runs ``call`` twice on a side stream (compiling and autotuning outside the
    capture, as CUDA graphs require), then captures it. Outputs live in the graph's memory pool
    and are overwritten by every replay.
    """
    captured = []

    def replay():
        if not captured:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                call(), call()
            torch.cuda.current_stream().wait_stream(side)
            from tritonlab._runtime import join_preload  # (here: tritonlab reads TRITON_INTERPRET at import)

            join_preload()  # tritonlab.preload's warm-up launches must not fall inside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outputs = call()
            captured.append((graph, outputs))
        graph, outputs = captured[0]
        graph.replay()
        return outputs

    return replay
