"""One fresh process's view of tuning: what it picks, how long its first call takes, how fast it runs.

    python -m phases.11_autotune.probe --mode table --workload attention@mid
    python -m phases.11_autotune.probe --mode full --model mid

Phase 11 starts this as a subprocess per measurement, with ``TRITONLAB_AUTOTUNE`` set to ``--mode``,
so nothing is carried over from an earlier tuning (Triton's in-process caches, our picks and direct
launches). ``--tables DIR`` reads the tables from DIR. It prints one JSON line, the last line of its
output:

- ``--workload FN@SHAPE``: ``first_s`` (the first call, with any tuning or lookup, to the GPU being
  done), ``ms`` (``common.timing.bench`` of later calls, with p20/p80), ``picks`` (each tuned
  kernel's configs) and ``tunings`` (what was timed: per kernel and key, the pick and every
  candidate's median ms; empty unless something was tuned);
- ``--model SHAPE``: the TransformerNP with our kernels (two-pass attention, staged fused MLP,
  grouped heads, GMM loss) under bf16 autocast: ``first_step_s`` (and of it Triton's compiling:
  ``first_step_compile_s``, kernels compiled and loaded from its cache) and ``steady_ms`` (the
  median of ``--steps`` steps after two warm-up steps), and the picks; with ``--profile``, instead,
  ``first_step_profile``: the first step's top functions under cProfile; with ``--sdpa``, the same
  model on PyTorch's components with SDPA cuDNN attention (the baseline's own first step).
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch

from common.timing import triton_compiles
from tritonlab import tuning_tables, tuning_workloads


def picks(kernels) -> dict[str, str]:
    """Per kernel, the configs its autotuner launched (identity strings, " + "-joined if several keys)."""
    tuner = tuning_tables.TUNER
    return {
        name: " + ".join(sorted({tuning_tables.config_id(c) for c in tuner.kernels[name].cache.values()}))
        for name in kernels
        if name in tuner.kernels and tuner.kernels[name].cache
    }


def _seconds(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def probe_workload(name: str) -> dict:
    from common.timing import bench

    function, shape = name.split("@")
    (workload,) = tuning_workloads.workloads([shape], functions=[function])
    run = workload.runner("cuda")
    first = _seconds(run)
    timing = bench(run)
    # A fresh tune's candidate times, side by side in this process: the per-kernel comparison.
    tunings = [
        {"kernel": t.kernel, "key": t.key, "pick": tuning_tables.config_id(t.pick), "timings": t.timings}
        for t in tuning_tables.TUNER.tunings
    ]
    return {"first_s": first, **timing.as_row(), "picks": picks(workload.kernels), "tunings": tunings}


def profiled(fn, top: int = 15) -> dict[str, list[list]]:
    """``fn`` under cProfile: the ``top`` functions by cumulative seconds and by their own seconds,
    each as [name, cumulative s, own s, calls] -- where a first call's time goes on the host
    (loading compiled kernels, hashing Triton's cache key, library handles, tuning-table lookups);
    cProfile itself slows the call, so its total is not the figure."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    torch.cuda.synchronize()
    profile.enable()
    fn()
    torch.cuda.synchronize()
    profile.disable()
    stats = pstats.Stats(profile).stats

    def listed(column: int) -> list[list]:
        rows = sorted(stats.items(), key=lambda item: -item[1][column])[:top]
        return [
            [f"{Path(file).name}:{line}({name})", round(cum, 4), round(own, 4), calls]
            for (file, line, name), (calls, _, own, cum, _) in rows
        ]

    return {"cumulative": listed(3), "own": listed(2)}


def probe_model(shape_name: str, steps: int, profile: bool = False, sdpa: bool = False) -> dict:
    from tritonlab.attention import attention
    from tritonlab.gmm import gmm_nll
    from tritonlab.grouped_gemm import gmm_heads
    from tritonlab.mlp import fused_mlp
    from tritonlab.models import (
        SHAPES,
        Components,
        TNPConfig,
        build,
        sample_tasks,
        sdpa_attention,
        train_step,
    )

    shape = SHAPES[shape_name]
    if sdpa:
        components = Components(attention=sdpa_attention("cudnn"))
    else:
        components = Components(attention=attention, mlp=fused_mlp, heads=gmm_heads, loss=gmm_nll)
    started = time.perf_counter()
    model, optimizer = build(TNPConfig(), components, device="cuda")
    tasks = sample_tasks(shape.batch, shape.m_context, shape.n_target, device="cuda")
    built = time.perf_counter() - started  # the model, its optimizer and the batch, before the first step

    def step():
        train_step(model, model.loss, optimizer, tasks, torch.bfloat16)

    if profile:  # the first step under cProfile: where it goes, not how long it takes
        where = profiled(step)
        return {"first_step_profile": where["cumulative"], "first_step_profile_own": where["own"]}
    with triton_compiles() as compiles:
        first = _seconds(step)
    for _ in range(2):
        step()
    times = sorted(_seconds(step) * 1e3 for _ in range(steps))
    tuning_workloads.import_kernels()
    return {
        "first_step_s": first,
        "build_s": built,
        "first_step_compile_s": compiles.compile_s,
        "first_step_kernels_compiled": compiles.compiled,
        "first_step_kernels_loaded": compiles.loaded,
        "steady_ms": times[len(times) // 2],
        "picks": picks(list(tuning_tables.TUNER.kernels)),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m phases.11_autotune.probe", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--mode", choices=tuning_tables.MODES, required=True)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--workload", help="FUNCTION@SHAPE, e.g. attention@mid")
    what.add_argument("--model", choices=tuning_workloads.TNP_SHAPES)
    parser.add_argument("--steps", type=int, default=10, help="steady steps timed with --model")
    parser.add_argument("--tables", default=None, help="read tables from this directory")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="with --model: profile the first step (cProfile) instead of timing",
    )
    parser.add_argument(
        "--sdpa",
        action="store_true",
        help="with --model: PyTorch's components and SDPA cuDNN instead of ours",
    )
    args = parser.parse_args(argv)
    os.environ[tuning_tables.ENV_VAR] = args.mode
    if args.tables:
        tuning_tables.TUNER.table_dir = Path(args.tables)
    if (args.profile or args.sdpa) and not args.model:
        parser.error("--profile, --sdpa: only with --model")
    result = (
        probe_workload(args.workload)
        if args.workload
        else probe_model(args.model, args.steps, args.profile, args.sdpa)
    )
    print(json.dumps({"mode": args.mode, **result}))


if __name__ == "__main__":
    main()
