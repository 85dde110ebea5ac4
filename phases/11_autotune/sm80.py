"""The A100 check: every config an A100 table could hold, compiled for sm_80 on this machine.

    python -m phases.11_autotune.sm80 [--shape SHAPE ...] [--out FILE]

No GPU is needed (nor used): Triton compiles for any target. Each workload of
``tritonlab.tuning_workloads`` (bf16, the model's head dim) runs with every autotuned launch
intercepted: for each config of that kernel's search space that an sm_80 GPU can run at all
(``KernelSpec.runs_on_sm80``: no TMA descriptors, no FP8), the launch's own arguments are bound by
Triton's binder for an sm_80 target -- so the compile sees the same specialisation (16-byte
alignment, integers divisible by 16) as a launch on an A100 would -- compiled to PTX and a cubin,
and ``ptxas -v`` on that PTX gives registers and spills. Plain (untuned) launches on the way are
skipped; a workload stops after its last tuned kernel.

A config is **usable on the A100** if it compiles, spills nothing and needs at most
``SM80_SHARED_BYTES`` of shared memory (163 KB opt-in per block). The results go to
``tritonlab/tables/sm80_compile.json`` (committed), which phase 11's GPU run reads to build
``a100_bf16.json`` from the H100's timings: per bucket, the fastest usable config.

Run it with ``TRITON_INTERPRET`` unset (``python -m phases 11`` starts it as a subprocess): the
kernels must be Triton JIT functions, not the interpreter's.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.driver import driver
from triton.runtime.jit import create_function_from_signature

from tritonlab import checks, tuning_tables, tuning_workloads
from tritonlab.tuning import ptxas_report

from .tables import SM80_RESULTS

TARGET = GPUTarget("cuda", 80, 32)
SM80_SHARED_BYTES = 163 * 1024


class _CompileOnlyDriver:
    """What Triton's launch path asks of its driver before compiling, for a GPU that is not here."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return TARGET


class _WorkloadDone(Exception):
    """Raised after a workload's last tuned kernel: nothing after it needs compiling."""


class Sm80Check:
    """Intercepts tuned launches (``Tuner.intercept``) and compiles each sm_80-runnable config."""

    def __init__(self):
        self.backend = make_backend(TARGET)
        self.rows: list[dict] = []
        self._compiled: dict = {}
        self.workload = None

    def compile(self, autotuner, args, kwargs, config) -> dict:
        fn = autotuner.fn
        options = {**kwargs, **config.all_kwargs()}
        binder = create_function_from_signature(fn.signature, fn.params, self.backend)
        bound, specialization, parsed = binder(*args, **options)
        parsed, signature, constexprs, attrs = fn._pack_args(
            self.backend, options, bound, specialization, parsed
        )
        key = (
            autotuner.spec.name,
            tuning_tables.config_id(config),
            repr(signature),
            repr(constexprs),
            repr(attrs),
        )
        if key not in self._compiled:
            started = time.perf_counter()
            try:
                out = triton.compile(
                    ASTSource(fn, signature, constexprs, attrs), target=TARGET, options=parsed.__dict__
                )
                result = {
                    **ptxas_report(out.asm["ptx"], f"sm_{TARGET.arch}"),
                    "shared_bytes": out.metadata.shared,
                    "error": "",
                }
            except Exception as e:  # a config that does not build is a result, not a stop
                result = {"registers": None, "spill_stores": None, "spill_loads": None, "shared_bytes": None,
                          "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}  # fmt: skip
            result["compile_s"] = round(time.perf_counter() - started, 1)
            self._compiled[key] = result
        return self._compiled[key]

    def __call__(self, autotuner, args, kwargs):
        kwargs = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
        all_args = {**dict(zip(autotuner.arg_names, args, strict=False)), **kwargs}
        all_args = {k: v for k, v in all_args.items() if k in autotuner.arg_names}
        spec, key = autotuner.spec, autotuner.bucket_key(all_args)
        runnable = [c for c in autotuner.configs if spec.runs_on_sm80(c)]
        for config in runnable:
            result = self.compile(autotuner, args, kwargs, config)
            usable = not result["error"] and result["spill_stores"] == 0 and result["spill_loads"] == 0
            usable = usable and result["shared_bytes"] <= SM80_SHARED_BYTES
            self.rows.append({
                "kernel": spec.name, "key": key, "workload": self.workload.name,
                "config": tuning_tables.config_id(config), "usable": usable, **result,
            })  # fmt: skip
        autotuner.best_config = (runnable or autotuner.configs)[0]
        if spec.name == self.workload.kernels[-1]:
            raise _WorkloadDone
        # A stand-in for the compiled kernel: callers keep it for direct launches, which do nothing here.
        return SimpleNamespace(
            run=lambda *a: None,
            launch_metadata=lambda *a: None,
            function=None,
            packed_metadata=None,
            n_regs=0,
            n_spills=0,
        )


def run_check(shapes) -> dict:
    """Compile every sm_80-runnable config at ``shapes``; the results file's contents."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("the sm_80 compile check needs TRITON_INTERPRET unset: it compiles real kernels")
    tuning_workloads.import_kernels()
    tuner = tuning_tables.TUNER
    check = Sm80Check()
    saved_device_type, saved_driver = checks.kernel_device_type, driver._active
    driver.set_active(_CompileOnlyDriver())
    knobs.runtime.jit_cache_hook = lambda *a, **k: True  # plain launches: neither compiled nor run
    checks.kernel_device_type = lambda: "cpu"  # the workloads' tensors live on the CPU here
    tuner.intercept = check
    try:
        for workload in tuning_workloads.workloads(shapes):
            kernels = [tuner.kernels[k] for k in workload.kernels]
            if not all(any(map(k.spec.runs_on_sm80, k.configs)) for k in kernels):
                continue  # a function an A100 cannot run: the staged MLP (TMA), the FP8 forward
            check.workload = workload
            print(f"sm_80: {workload.name}", flush=True)
            try:
                workload.runner("cpu", random=False)()
            except _WorkloadDone:
                pass
            except RuntimeError as e:  # autograd re-raises a backward's exception as its own error
                if "_WorkloadDone" not in repr(e) and not isinstance(e.__cause__, _WorkloadDone):
                    raise
    finally:
        tuner.intercept = None
        checks.kernel_device_type = saved_device_type
        knobs.runtime.jit_cache_hook = None
        driver.set_active(saved_driver)
    return {
        "target": f"sm_{TARGET.arch}",
        "shared_limit_bytes": SM80_SHARED_BYTES,
        "triton": triton.__version__,
        "torch": torch.__version__.split("+")[0],
        "rows": check.rows,
    }


def summary(results: dict) -> str:
    rows = results["rows"]
    distinct = {(r["kernel"], r["config"], r["key"]) for r in rows}
    bad = sorted({(r["kernel"], r["config"], r["error"] or f"spills {r['spill_stores']}/{r['spill_loads']} B, "
                   f"shared {r['shared_bytes']} B") for r in rows if not r["usable"]})  # fmt: skip
    lines = [f"{len(distinct)} (kernel, config, bucket) compiled for {results['target']}; "
             f"{len(bad)} kernel/config pairs unusable"]  # fmt: skip
    lines += [f"  {k} {c}: {why}" for k, c, why in bad]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m phases.11_autotune.sm80", description=__doc__.splitlines()[0]
    )
    every = [*tuning_workloads.TNP_SHAPES, *tuning_workloads.SWEEP_SHAPES]
    parser.add_argument(
        "--shape",
        nargs="+",
        default=every,
        choices=["tiny", *every],
        help="shapes to compile at (default: the TNP's small, mid, large and the attention sweep)",
    )
    parser.add_argument(
        "--out", type=Path, default=SM80_RESULTS, help="the results file (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    results = run_check(args.shape)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(summary(results))
    print(f"sm_80 results: {args.out}")


if __name__ == "__main__":
    sys.exit(main())
