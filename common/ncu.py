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
the exponential unit (XU) were, how often a scheduler issued, registers, spilled-register
instructions and the largest stall reasons (a counter the chosen sections did not collect is left out).
``render_profile`` is a report's table of them.
Clocks are left as they are (``--clock-control none``), so times match the benchmarks'.
"""

import argparse
import csv
import io
import re
import subprocess
from collections.abc import Callable

import torch

from tritonlab.models import TNPShape, resolve_shape

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
    "launch__registers_per_thread": "registers",
    "launch__occupancy_limit_registers": "blocks_per_sm",
    "sass__inst_executed_register_spilling": "spill_instructions",
}
TIME_UNITS_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio")
NVTX_RANGE = re.compile(r"<default domain>:([^:]+):")
SUBDIR = "ncu"
COLUMNS = ["variant", "kernel", "grid", "block", *METRICS.values(), "stalls"]


def require_gpu() -> None:
    """An ncu_pass profiles GPU kernels: without a GPU it stops, saying so."""
    if not ON_GPU:
        raise SystemExit("ncu_pass: needs a CUDA GPU (and ncu around it)")


def pass_shape(prog: str, argv=None) -> TNPShape:
    """The command line of a phase's ncu_pass: the TransformerNP ``--shape`` it profiles (mid by
    default). Checks for a GPU first."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--shape", default="mid")
    args = parser.parse_args(argv)
    require_gpu()
    return resolve_shape(args.shape)


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
        ranked = sorted(((float(line[i] or 0), reason) for reason, i in stalls), reverse=True)
        row["stalls"] = ", ".join(f"{reason} {cycles:.2f}" for cycles, reason in ranked[:top_stalls])
        rows.append(row)
    return rows


def render_profile(phase: str, gpu: str) -> str:
    """The newest profile on ``gpu`` under reports/data/<phase>/ncu/, as markdown ("" if none)."""
    df = load_phase(phase, SUBDIR)
    if df.empty or gpu not in set(df["gpu"]):
        return ""
    on_gpu = df.loc[df["gpu"] == gpu]
    newest = on_gpu.loc[on_gpu["run_id"] == on_gpu["run_id"].max()]
    first = newest.iloc[0]
    return (
        "\n## Where the time goes (Nsight Compute)\n\n"
        f"One call of each implementation at {first['shape']}, {first['dtype']} (commit {first['git_commit']}, "
        f"{first['utc']}), profiled with `common/ncu.py`'s two steps. `tensor_pct`, `xu_pct` (exponentials) "
        "and `fma_pct`: how busy those pipes were while the SMs were active; `issue_pct` (where collected): how "
        "often a scheduler issued an instruction; `l2_pct`: L2 throughput against its peak; `blocks_per_sm`: the programs per SM that the registers allow; "
        "`stalls`: the largest reasons a warp waited, in cycles per issued instruction.\n\n"
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
            f"tensor {row.get('tensor_pct', 0):4.0f}%  xu {row.get('xu_pct', 0):4.0f}%  {row['stalls']}"
        )
    print(f"rows: {writer.path}")


if __name__ == "__main__":
    main()
