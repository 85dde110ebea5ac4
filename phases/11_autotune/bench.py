"""Phase 11's cells.

On a GPU, in this order:

- **tune** (one cell per workload: a public function at a TNP shape, bf16): the workload runs once
  in this process under ``TRITONLAB_AUTOTUNE=full``, so every registered kernel on its path times
  its whole (pruned) search space at that bucket; the row names the picks. FlashAttention-2, whose
  tiles are not autotuned, gets a cell per ``FLASH2_SHAPES`` entry that times its candidates. After the last one,
  :func:`write_tables` writes ``<gpu>_bf16.json`` into the table directory and, on an H100, the
  A100's table from it and the committed sm_80 compile results.
- **compare** (per workload): fresh processes (``probe.py``) with the table (``table``), without
  any tuning (``off``: each kernel's default) and ``--repeats`` times with a fresh full tune
  (``full``). The row: each one's median ms, the table's time over the fresh tunes' median (goal:
  within 2%), the default's, and the distinct picks of the fresh tunes (their spread).
- **kernel** (per tuned kernel of the workload, from the same processes): inside each fresh tune,
  where every candidate was timed side by side, the table's pick and the default against that
  tune's best (median over the tunes), and how many different configs the fresh tunes picked.
- **startup** (per ``--startup-shape``): the TransformerNP with our kernels in fresh processes, with
  the table (compiling every kernel, then again with the compiled kernels on disk) and with a fresh
  full tune: the first training step's seconds against a steady step's (goal with the table: within
  2x).

Without a GPU: a **smoke** cell per function at the tiny shape (fp32) in Triton's interpreter, and
the **sm80** cell, which runs the sm_80 compile check (``sm80.py``) in a subprocess without the
interpreter and writes one row per compiled (kernel, config, bucket).
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton
import triton.testing

from common import Cell
from common.provenance import provenance
from tritonlab import tuning_tables as tt
from tritonlab import tuning_workloads

from . import tables

REPO = Path(__file__).resolve().parents[2]


def _probe(
    mode: str, what: list[str], table_dir: Path, timeout: int = 900, cache_dir: Path | None = None
) -> dict:
    """One fresh process of ``probe.py``; its JSON line. ``cache_dir``: Triton's compile cache for
    that process (``TRITON_CACHE_DIR``); by default the caller's."""
    env = {**os.environ, tt.ENV_VAR: mode}
    env.pop("TRITON_INTERPRET", None)
    if cache_dir is not None:
        env["TRITON_CACHE_DIR"] = str(cache_dir)
    cmd = [
        sys.executable,
        "-m",
        "phases.11_autotune.probe",
        "--mode",
        mode,
        "--tables",
        str(table_dir),
        *what,
    ]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"probe {' '.join(what)} ({mode}) failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _pick_text(picks: dict) -> str:
    return "; ".join(f"{kernel}: {config}" for kernel, config in sorted(picks.items()))


def tune_cell(workload, tuned: list) -> Cell:
    """Run ``workload`` once under a full tune; what it timed goes into ``tuned`` (Tuning, workload)."""

    def run():
        os.environ[tt.ENV_VAR] = "full"
        before = len(tt.TUNER.tunings)
        call = workload.runner("cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        new = tt.TUNER.tunings[before:]
        tuned.extend((t, workload.name) for t in new)
        return {
            "tune_s": time.perf_counter() - start,
            "kernels_tuned": len(new),
            "picks": "; ".join(f"{t.kernel} @ {t.key}: {tt.config_id(t.pick)}" for t in new),
        }

    return Cell("tune", workload.shape, "bf16", run, {"function": workload.function})


def flash2_tune_cell(shape: tuple[int, int, int], tuned: list, causal: bool = True) -> Cell:
    """FlashAttention-2's tiles are not autotuned: each kernel's ``TUNE_CANDIDATES`` timed here (the
    backward's kernels as the whole backward, the other kernel's tiles from the code table), checked
    against the code table's result, the fastest kept in ``tuned`` like an autotuner's pick."""
    batch, n, head_dim = shape

    def run():
        from triton.runtime.errors import OutOfResources, PTXASError

        from tritonlab.attention import flash2
        from tritonlab.testing import rel_err

        dtype = torch.bfloat16
        q, k, v, grad_o = (torch.randn(batch, n, head_dim, dtype=dtype, device="cuda") for _ in range(4))
        o, lse = flash2.flash_forward(q, k, v, causal, impl="triton")
        calls = {
            "fwd": lambda c: flash2.flash_forward(q, k, v, causal, config=c, impl="triton"),
            "dq": lambda c: flash2.flash_backward(
                q, k, v, o, lse, grad_o, causal, dq_config=c, impl="triton"
            ),
            "dkdv": lambda c: flash2.flash_backward(
                q, k, v, o, lse, grad_o, causal, dkdv_config=c, impl="triton"
            ),
        }
        gpu = tt.gpu_slug(torch.cuda.get_device_name())
        picks = []
        for kernel, candidates in flash2.TUNE_CANDIDATES.items():
            reference = calls[kernel](None)
            start, timings, configs = time.perf_counter(), {}, {}
            for tiles in candidates:
                config = triton.Config(
                    {"BLOCK_M": tiles.block_m, "BLOCK_N": tiles.block_n},
                    num_warps=tiles.num_warps, num_stages=tiles.num_stages,
                )  # fmt: skip
                cid = tt.config_id(config)
                configs[cid] = config
                try:
                    err = max(rel_err(a, b) for a, b in zip(calls[kernel](tiles), reference, strict=True))
                    if not err <= 1e-2:
                        raise AssertionError(
                            f"flash2 {kernel} {cid}: error {err:.3g} against the code table's tiles"
                        )
                    timings[cid] = triton.testing.do_bench(
                        lambda t=tiles, f=calls[kernel]: f(t), warmup=5, rep=60
                    )
                except (OutOfResources, PTXASError):  # does not fit this GPU: never picked
                    timings[cid] = float("inf")
            best = min(timings, key=timings.get)
            tuning = tt.Tuning(
                flash2.table_name(kernel), flash2.table_key(dtype, head_dim, causal), gpu, "bf16", configs[best],
                timings, time.perf_counter() - start,
            )  # fmt: skip
            tuned.append((tuning, f"flash2@B{batch}N{n}D{head_dim}"))
            picks.append(f"{tuning.kernel}: {best}")
        return {"kernels_tuned": len(picks), "picks": "; ".join(picks)}

    return Cell("tune", f"B={batch} N={n} D={head_dim}", "bf16", run, {"function": "flash2"})


def write_tables(tuned: list, table_dir: Path, sm80_path: Path = tables.SM80_RESULTS) -> list[Path]:
    """Write the tables of this run's tunings (and the A100's from an H100 bf16 table)."""
    workload_of = {(t.kernel, t.key): name for t, name in tuned}
    written = []
    for table in tables.tables_from_tunings([t for t, _ in tuned], provenance(), table_dir, workload_of):
        written.append(table.save())
        if table.gpu == "h100" and table.dtype == "bf16":
            sm80 = tables.load_sm80(sm80_path)
            if sm80 is not None:
                a100 = tables.a100_table(table, sm80, tt.TUNER.kernels, "bf16")
                written.append(a100.save(tt.table_path("a100", "bf16", table_dir)))
    return written


def compare_cells(workload, table_dir: Path, repeats: int) -> list[Cell]:
    """The workload's compare cell, then one per tuned kernel from the same probes."""
    probes: dict = {}
    cells = [compare_cell(workload, table_dir, repeats, probes)]
    cells += [kernel_cell(workload, kernel, probes) for kernel in workload.kernels]
    return cells


def compare_cell(workload, table_dir: Path, repeats: int, probes: dict) -> Cell:
    """Fresh processes: the table, off, and ``repeats`` full tunes; kept in ``probes`` for the
    kernel cells that follow."""

    def run():
        what = ["--workload", workload.name]
        table = probes["table"] = _probe("table", what, table_dir)
        off = probes["off"] = _probe("off", what, table_dir)
        full = probes["full"] = [_probe("full", what, table_dir) for _ in range(repeats)]
        full_ms = sorted(p["ms"] for p in full)
        median = full_ms[len(full_ms) // 2]
        distinct = sorted({_pick_text(p["picks"]) for p in full})
        return {
            "ms_table": table["ms"],
            "ms_off": off["ms"],
            "ms_full": median,
            "ms_full_min": full_ms[0],
            "ms_full_max": full_ms[-1],
            "table_vs_full": table["ms"] / median,
            "off_vs_full": off["ms"] / median,
            "first_s_table": table["first_s"],
            "first_s_full": sorted(p["first_s"] for p in full)[len(full) // 2],
            "repeats": repeats,
            "distinct_full_picks": len(distinct),
            "picks_table": _pick_text(table["picks"]),
            "picks_off": _pick_text(off["picks"]),
            "picks_full": " | ".join(distinct),
        }

    return Cell("compare", workload.shape, "bf16", run, {"function": workload.function})


def kernel_cell(workload, kernel: str, probes: dict) -> Cell:
    """One kernel of the workload, judged inside each fresh tune, where every candidate was timed
    side by side: the table's pick and the default (``off``'s) against that tune's best, as the
    median over the fresh tunes, and how many different configs the fresh tunes picked."""

    def run():
        if "full" not in probes:
            raise RuntimeError(f"{workload.name}: its compare cell did not run")
        table_pick = probes["table"]["picks"].get(kernel, "")
        off_pick = probes["off"]["picks"].get(kernel, "")
        tunings = [t for p in probes["full"] for t in p["tunings"] if t["kernel"] == kernel]
        if not tunings:
            raise RuntimeError(
                f"{kernel}: no fresh tune timed it at {workload.name} (tuned by an earlier key?)"
            )

        def median_ratio(pick: str) -> float:
            ratios = sorted(
                (t["timings"].get(pick) or float("inf")) / min(t["timings"].values()) for t in tunings
            )
            return ratios[len(ratios) // 2]

        picks = sorted({t["pick"] for t in tunings})
        return {
            "key": tunings[0]["key"],
            "table_vs_best": median_ratio(table_pick),
            "off_vs_best": median_ratio(off_pick),
            "best_ms": sorted(min(t["timings"].values()) for t in tunings)[len(tunings) // 2],
            "distinct_picks": len(picks),
            "pick_table": table_pick,
            "pick_off": off_pick,
            "picks_full": " | ".join(picks),
        }

    return Cell("kernel", workload.shape, "bf16", run, {"function": workload.function, "kernel": kernel})


def startup_cell(shape: str, table_dir: Path, steps: int = 10) -> Cell:
    """Fresh processes, each with an empty Triton compile cache of its own except the second:
    the table with every kernel compiled from scratch (``table_cold``), the table again on the first's
    cache (``table_warm``: a restart, nothing left to compile or tune), and a full tune (``full``:
    what the first run costs without a table). Compilation is not tuning; the split shows which is
    which. A fifth process times the same model on PyTorch's components with SDPA cuDNN (``sdpa``,
    the warm cache): the first step a user of the baseline pays."""

    def run():
        what = ["--model", shape, "--steps", str(steps)]
        with tempfile.TemporaryDirectory() as table_cache, tempfile.TemporaryDirectory() as full_cache:
            cold = _probe("table", what, table_dir, timeout=1800, cache_dir=Path(table_cache))
            warm = _probe("table", what, table_dir, timeout=1800, cache_dir=Path(table_cache))
            where = _probe(
                "table", [*what, "--profile"], table_dir, timeout=1800, cache_dir=Path(table_cache)
            )
            full = _probe("full", what, table_dir, timeout=1800, cache_dir=Path(full_cache))
            sdpa = _probe("table", [*what, "--sdpa"], table_dir, timeout=1800, cache_dir=Path(table_cache))
        return {
            # Building the model, its optimizer and the batch, before the first step: what
            # tritonlab.preload's thread overlaps (a row's build + first step is what a user waits).
            **{
                f"build_s_{case}": probe.get("build_s")
                for case, probe in (("table_warm", warm), ("sdpa", sdpa))
            },
            "first_step_s_table_cold": cold["first_step_s"],
            "first_step_s_table_warm": warm["first_step_s"],
            "first_step_s_full": full["first_step_s"],
            "steady_ms": warm["steady_ms"],
            "steady_ms_full": full["steady_ms"],
            "first_vs_steady_table_cold": cold["first_step_s"] * 1e3 / cold["steady_ms"],
            "first_vs_steady_table_warm": warm["first_step_s"] * 1e3 / warm["steady_ms"],
            "first_vs_steady_full": full["first_step_s"] * 1e3 / full["steady_ms"],
            # The baseline's own first step: PyTorch pays its first-use costs too (cuBLAS handles,
            # lazily loaded kernels, the autograd engine's threads).
            "first_step_s_sdpa": sdpa["first_step_s"],
            "steady_ms_sdpa": sdpa["steady_ms"],
            "first_vs_steady_sdpa": sdpa["first_step_s"] * 1e3 / sdpa["steady_ms"],
            **{
                f"{field}_{case}": probe.get(f"first_step_{field}")
                for case, probe in (("table_cold", cold), ("table_warm", warm), ("full", full))
                for field in ("compile_s", "kernels_compiled", "kernels_loaded")
            },
            "picks_table": _pick_text(warm["picks"]),
            # Where a restart's first step goes (a fourth process, the warm cache, under cProfile).
            "first_step_profile_table_warm": "; ".join(
                f"{name} {cum:.3f}s ({calls} calls)" for name, cum, _, calls in where["first_step_profile"]
            ),
            # The same profile by each function's own time: what the cumulative list's callers spend.
            "first_step_profile_own_table_warm": "; ".join(
                f"{name} {own:.3f}s ({calls} calls)"
                for name, _, own, calls in where.get("first_step_profile_own", [])
            ),
        }

    return Cell("startup", shape, "bf16", run, {"function": "TransformerNP"})


# The interpreter's bf16 dots are wrong: fp32, or fp16 where a function takes no fp32.
SMOKE_DTYPES = {"fp8_attention": torch.float16}


def smoke_cell(function: str) -> Cell:
    """One function at the tiny shape in the interpreter."""
    dtype = SMOKE_DTYPES.get(function, torch.float32)

    def run():
        (workload,) = tuning_workloads.workloads(["tiny"], (dtype,), [function])
        workload.runner("cpu")()
        return {}

    return Cell(f"smoke {function}", "tiny", tt.dtype_name(dtype), run, {"function": function})


def sm80_cell(shapes: list[str], out: Path) -> Cell:
    """The sm_80 compile check in a subprocess without the interpreter; the row of the cell says how
    many configs compiled and how many are unusable (the per-config results stay in ``out``)."""

    def run():
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        cmd = [sys.executable, "-m", "phases.11_autotune.sm80", "--shape", *shapes, "--out", str(out)]
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise RuntimeError(f"sm_80 compile check failed: {done.stderr.strip().splitlines()[-1:]}")
        rows = json.loads(out.read_text())["rows"]
        unusable = sorted({f"{r['kernel']} {r['config']}" for r in rows if not r["usable"]})
        return {
            "compiled": len({(r["kernel"], r["key"], r["config"]) for r in rows}),
            "unusable_pairs": len(unusable),
            "unusable": "; ".join(unusable),
            "results_file": str(out),
        }

    return Cell("sm80", "+".join(shapes), "bf16", run, {"function": "all"})
