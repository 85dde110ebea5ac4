"""One fresh process's cold start of the phase's training, with or without selection.

    python -m phases.autoselect.probe --size seed --way autoselect --dtype bf16 --batch 16 --context 256 \
        --cache /tmp/empty/autoselect.json

From the end of its imports it builds the model as the phase does (PyTorch's components, seeded),
makes the phase's first batch, for ``--way autoselect`` selects on it (mode "train", under the
dtype's autocast, with the ``--cache`` file: give a path that does not exist, for a cold start) and
swaps the choices in, then takes one training step. So the process's first CUDA, cuBLAS and SDPA
calls, which a training run pays at its first step anyway, fall on both ways, and the difference of
their totals is what selection adds to a start. It prints one JSON line: ``way``, ``build_s``,
``select_s`` (0 for PyTorch), ``first_step_s`` and ``total_s`` (from the imports to the end of the
first step), in seconds. The phase starts it as a subprocess (``bench.cold_start``).
"""

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from common.device import use_interpreter_without_gpu

use_interpreter_without_gpu()  # before tritonlab's kernels are imported: the CPU runs them interpreted

from common.device import synchronize as sync  # noqa: E402
from tritonlab import autoselect  # noqa: E402

from .bench import DTYPES, SIZES, Plan, adamw, batches, build, select_for, step  # noqa: E402

WAYS = ("pytorch", "autoselect")


def probe(plan: Plan, way: str, cache: Path | None, started: float) -> dict:
    """The seconds of each part of a start from ``started`` (the end of the imports) on."""
    model = build(plan, "pytorch")
    optimizer = adamw(model)
    data = batches(replace(plan, steps=1))
    sync()
    selected = built = time.perf_counter()
    if way == "autoselect":
        autoselect.apply(model, select_for(model, plan, data, cache, timer=None))
        sync()
        selected = time.perf_counter()
    step(model, optimizer, data[0], plan.dtype)  # synchronized at its end
    done = time.perf_counter()
    return {
        "way": way,
        "build_s": built - started,
        "select_s": selected - built,
        "first_step_s": done - selected,
        "total_s": done - started,
    }


def main(argv=None) -> None:
    started = time.perf_counter()
    parser = argparse.ArgumentParser(
        prog="python -m phases.autoselect.probe", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--size", choices=list(SIZES), required=True)
    parser.add_argument("--way", choices=WAYS, required=True)
    parser.add_argument("--dtype", choices=list(DTYPES), required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--context", type=int, required=True)
    parser.add_argument("--cache", type=Path, help="the selection's cache file (--way autoselect)")
    args = parser.parse_args(argv)
    if args.way == "autoselect" and args.cache is None:
        parser.error("--way autoselect: needs --cache (a path that does not exist, for a cold start)")
    plan = Plan(args.size, args.dtype, args.batch, args.context, steps=1, warmup=0)
    print(json.dumps(probe(plan, args.way, args.cache, started)))


if __name__ == "__main__":
    main()
