"""Nsight Compute, for notes that say where a kernel's time goes: profile once, keep a few counters.

    ncu --clock-control none --profile-from-start off --nvtx \\
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy \\
        --section LaunchStats --section WarpStateStats --section SchedulerStats -o /tmp/prof python -m phases.<phase>.ncu_pass
    python -m common.ncu /tmp/prof.ncu-rep --phase <phase> --shape mid

A phase's ``ncu_pass`` module hands its calls to ``profile_once``: each runs a few times first
(compiling and autotuning outside the profiled range), then once between cudaProfilerStart and
cudaProfilerStop, inside an NVTX range named after it. The second command reads the report back
(``ncu --import ... --csv --page raw``) and writes one row per kernel under
``reports/data/<phase>/ncu/``: the call that launched it, its time, how busy the tensor cores and
the exponential unit (XU) were, how often a scheduler issued, the achieved occupancy, registers,
spilled-register instructions and the largest stall reasons (a counter the chosen sections did not
collect is left out). ``render_profile`` is a report's table of them, with a sentence per call
comparing it with a baseline's.
Clocks are left as they are (``--clock-control none``), so times match the benchmarks'.
"""

import argparse
import csv
import io
import re
import subprocess
from collections.abc import Callable

import pandas as pd
import torch

from tritonlab.models import SHAPES, TNPShape, resolve_shape

from .device import ON_GPU
from .report import load_phase, markdown_table
from .results import ResultWriter

# Raw metric names of Nsight Compute 2025 on sm_90, and the columns they become.
METRICS = {
    "gpu__time_duration.sum": "time_ms",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active": "tensor_pct",
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active": "xu_pct",
    "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active": "fma_pct",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue_pct",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "l2_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct",
    "launch__registers_per_thread": "registers",
    "launch__occupancy_limit_registers": "blocks_per_sm",
    "sass__inst_executed_register_spilling": "spill_instructions",
}
TIME_UNITS_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio")
NOT_A_STALL = "selected"  # the cycle a warp issues: 1.00 per issued instruction by definition
NVTX_RANGE = re.compile(r"<default domain>:([^:]+):")
SUBDIR = "ncu"
COLUMNS = ["variant", "kernel", "grid", "block", *METRICS.values(), "stalls"]


def require_gpu() -> None:
    """An ncu_pass profiles GPU kernels: without a GPU it stops, saying so."""
    if not ON_GPU:
        raise SystemExit("ncu_pass: needs a CUDA GPU (and ncu around it)")


def parse_pass_shape(prog: str, argv=None, **shape):
    """The command line of a phase's ncu_pass: its ``--shape``, declared by ``add_argument``'s
    keywords ``shape`` (a default, a type, nargs). Parses first, so ``--help`` works anywhere, then
    checks for a GPU."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--shape", **shape)
    args = parser.parse_args(argv)
    require_gpu()
    return args.shape


def pass_shape(prog: str, argv=None) -> TNPShape:
    """:func:`parse_pass_shape` for a TransformerNP ``--shape`` (mid by default)."""
    return resolve_shape(parse_pass_shape(prog, argv, default="mid", choices=list(SHAPES)))


def profile_once(calls: dict[str, Callable[[], object]], warmup: int = 3) -> None:
    """Warm every call up, then run each once in the profiled range, in its own NVTX range."""
    for call in calls.values():
        for _ in range(warmup):
            call()
    torch.cuda.synchronize()
    for name, call in calls.items():
        torch.cuda.nvtx.range_push(name)
        torch.cuda.cudart().cudaProfilerStart()
        call()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        torch.cuda.nvtx.range_pop()


def parse_raw(text: str, top_stalls: int = 3) -> list[dict]:
    """Rows of ``ncu --csv --page raw`` (a header, a units line, one line per kernel) as dicts.

    Only the forward's first kernel of a call carries its NVTX range -- autograd launches the
    backward from a thread of its own, outside the range -- so each kernel is credited to the
    latest range seen: the calls ran one after another.
    """
    lines = list(csv.reader(io.StringIO(text)))
    header, units, data = lines[0], lines[1], lines[2:]
    col = {name: i for i, name in enumerate(header)}
    nvtx = next((i for i, name in enumerate(header) if name.startswith("thread Domain:Push/Pop_Range")), None)
    stalls = [(m.group(1), i) for i, name in enumerate(header) if (m := STALL.fullmatch(name))]
    rows, call = [], ""
    for line in data:
        if nvtx is not None and (found := NVTX_RANGE.search(line[nvtx])):
            call = found.group(1)
        row = {
            "variant": call,
            "kernel": line[col["Kernel Name"]][:60],
            "grid": line[col["Grid Size"]],
            "block": line[col["Block Size"]],
        }
        for metric, name in METRICS.items():
            if metric in col and line[col[metric]] != "":
                value = float(line[col[metric]].replace(",", ""))
                if name == "time_ms":
                    value *= TIME_UNITS_MS[units[col[metric]]]
                row[name] = value
        ranked = sorted(
            ((float(line[i] or 0), reason) for reason, i in stalls if reason != NOT_A_STALL), reverse=True
        )
        row["stalls"] = ", ".join(f"{reason} {cycles:.2f}" for cycles, reason in ranked[:top_stalls])
        rows.append(row)
    return rows


def top_stall(stalls) -> tuple[str, float] | None:
    """The largest reason of a row's ``stalls`` ("wait 1.31, barrier 1.15") and its cycles;
    ``selected`` is skipped (rows written before parse_raw left it out have it)."""
    for item in stalls.split(", ") if isinstance(stalls, str) else []:
        reason, _, cycles = item.rpartition(" ")
        if reason and reason != NOT_A_STALL:
            return reason, float(cycles)
    return None


def _weighted(kernels: pd.DataFrame, column: str) -> float | None:
    """``column`` over a call's kernels, each weighted by its time (None where it was not collected)."""
    if column not in kernels or kernels[column].isna().any():
        return None
    return float((kernels[column] * kernels["time_ms"]).sum() / kernels["time_ms"].sum())


# The counters a comparison names, weighted by kernel time, and how it names them.
COMPARED = {
    "tensor_pct": "the tensor pipe is busy {} of active cycles",
    "issue_pct": "a scheduler issues in {} of cycles",
    "occupancy_pct": "{} of the warp slots are occupied",
}


def _summary(kernels: pd.DataFrame) -> dict:
    longest = kernels.loc[kernels["time_ms"].idxmax()]
    return {
        "ms": kernels["time_ms"].sum(),
        "kernels": len(kernels),
        **{column: _weighted(kernels, column) for column in COMPARED},
        "longest": f"`{longest['kernel']}`, {longest['time_ms']:.2f} ms",
        "stall": top_stall(longest["stalls"]),
    }


def compare_calls(rows: pd.DataFrame, baseline: str) -> str:
    """A sentence per call of ``rows`` (one profile) against ``baseline``'s: kernel time, the
    counters of COMPARED weighted by kernel time, and the largest stall of each one's longest kernel.
    "" without the baseline's rows."""
    calls = dict(tuple(rows.groupby("variant", sort=False)))
    if baseline not in calls:
        return ""
    base = _summary(calls.pop(baseline))
    sentences = []
    for name, kernels in calls.items():
        ours = _summary(kernels)
        count = f"{ours['kernels']} kernel" + "s" * (ours["kernels"] > 1)
        parts = [
            f"`{name}` runs {ours['ms']:.2f} ms in {count} against `{baseline}`'s {base['ms']:.2f} ms "
            f"in {base['kernels']} ({ours['ms'] / base['ms']:.2f}× its time)"
        ]
        pipes = [
            phrase.format(f"{ours[column]:.0f}%") + f" against {base[column]:.0f}%"
            for column, phrase in COMPARED.items()
            if ours[column] is not None and base[column] is not None
        ]
        if pipes:
            parts.append("weighted by kernel time, " + ", ".join(pipes))
        if ours["stall"] and base["stall"]:
            parts.append(
                f"its longest kernel ({ours['longest']}) stalls most on `{ours['stall'][0]}` "
                f"({ours['stall'][1]:.2f} cycles per issued instruction), `{baseline}`'s "
                f"({base['longest']}) on `{base['stall'][0]}` ({base['stall'][1]:.2f})"
            )
        sentences.append("; ".join(parts) + ".")
    return " ".join(sentences)


def render_profile(phase: str, gpu: str, baseline: str | None = None) -> str:
    """The newest profile on ``gpu`` under reports/data/<phase>/ncu/ as a markdown section -- with
    ``baseline``, :func:`compare_calls` above its table. Without any profile of the phase, the section
    is one line saying so; with profiles of other GPUs only, "" (their sections show them)."""
    heading = "\n## Where the time goes (Nsight Compute)\n\n"
    df = load_phase(phase, SUBDIR)
    if df.empty:
        return heading + f"_Not profiled yet: `phases/{phase}/ncu_pass.py` has the two commands._\n"
    if gpu not in set(df["gpu"]):
        return ""
    on_gpu = df.loc[df["gpu"] == gpu]
    newest = on_gpu.loc[on_gpu["run_id"] == on_gpu["run_id"].max()]
    first = newest.iloc[0]
    comparison = compare_calls(newest, baseline) if baseline else ""
    return (
        heading
        + f"One call of each implementation at {first['shape']}, {first['dtype']} (commit {first['git_commit']}, "
        f"{first['utc']}), profiled with `common/ncu.py`'s two steps. `tensor_pct`, `xu_pct` (exponentials) "
        "and `fma_pct`: how busy those pipes were while the SMs were active; `issue_pct` (where collected): how "
        "often a scheduler issued an instruction; `l2_pct`: L2 throughput against its peak; `occupancy_pct` "
        "(where collected): the achieved occupancy, active warps against the most an SM holds; "
        "`blocks_per_sm`: the programs per SM that the registers allow; "
        "`stalls`: the largest reasons a warp waited, in cycles per issued instruction.\n\n"
        + (comparison + "\n\n" if comparison else "")
        + markdown_table(newest, [c for c in COLUMNS if c in newest])
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m common.ncu", description=__doc__.splitlines()[0])
    parser.add_argument("report", help="the .ncu-rep file ncu wrote")
    parser.add_argument("--phase", required=True)
    parser.add_argument("--shape", required=True, help="the shape the ncu_pass profiled, for the rows")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args(argv)
    raw = subprocess.run(
        ["ncu", "--import", args.report, "--csv", "--page", "raw"], check=True, capture_output=True, text=True
    ).stdout
    writer = ResultWriter(args.phase, subdir=SUBDIR)
    for row in parse_raw(raw):
        writer.write({**row, "shape": args.shape, "dtype": args.dtype})
        print(
            f"{row['variant']:14s} {row['kernel'][:40]:40s} {row.get('time_ms', float('nan')):9.3f} ms  "
            f"tensor {row.get('tensor_pct', 0):4.0f}%  xu {row.get('xu_pct', 0):4.0f}%  "
            f"issue {row.get('issue_pct', 0):4.0f}%  occupancy {row.get('occupancy_pct', 0):4.0f}%  {row['stalls']}"
        )
    print(f"rows: {writer.path}")


if __name__ == "__main__":
    main()
