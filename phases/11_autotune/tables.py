"""Phase 11's tables: the tunings of a run as one table per GPU and dtype, and the A100's from the H100's.

- :func:`tables_from_tunings`: every ``tuning_tables.Tuning`` the run timed becomes an entry -- the
  pick, its median time, the runner-up's, every candidate's time (the A100 table chooses from
  them), the workload it was tuned at, the versions and commit -- merged into any table already
  there (entries of other keys, e.g. FP8 ones from another run, are kept).
- :func:`a100_table`: per entry of an H100 table, the fastest candidate (by the H100's times) that
  the sm_80 compile check (``sm80.py``) found usable at that kernel and key: it compiles, spills
  nothing and fits 163 KB of shared memory. Where the H100 timed none of them (its prune kept only
  TMA configs, at long keys), the first usable config of the search space. Status "compiled for
  sm_80, not timed".
"""

import json
import logging
import math
from pathlib import Path

from tritonlab import tuning_tables as tt

logger = logging.getLogger("tritonlab")
# The sm_80 compile check's results (sm80.py), committed: what an A100 table may hold.
SM80_RESULTS = tt.TABLE_DIR / "sm80_compile.json"


def _existing(gpu: str, dtype: str, table_dir: Path) -> tt.ConfigTable:
    path = tt.table_path(gpu, dtype, table_dir)
    if path.exists():
        try:
            return tt.ConfigTable.load(path)
        except tt.TableError as e:
            logger.warning("replacing an unusable table: %s", e)
    return tt.ConfigTable(gpu, dtype, path=path)


def tables_from_tunings(tunings, provenance: dict, table_dir: Path, workload_of: dict | None = None) -> list:
    """The run's tunings merged into the tables of ``table_dir`` (not yet saved), one per GPU and
    dtype. ``provenance``: the row provenance (device name, versions, commit, utc);
    ``workload_of``: (kernel, key) -> the workload it was tuned at."""
    tables: dict[tuple[str, str], tt.ConfigTable] = {}
    for tuning in tunings:
        table = tables.get((tuning.gpu, tuning.dtype))
        if table is None:
            table = tables[tuning.gpu, tuning.dtype] = _existing(tuning.gpu, tuning.dtype, table_dir)
        table.meta.update(device_name=provenance.get("gpu", ""))
        # Candidates that failed to compile or run time as inf: null in the file (JSON has no inf).
        ranked = sorted((ms, cid) for cid, ms in tuning.timings.items() if math.isfinite(ms))
        failed = {cid: None for cid, ms in tuning.timings.items() if not math.isfinite(ms)}
        table.put(tuning.kernel, tuning.key, {
            "config": tt.config_to_json(tuning.pick),
            "status": tt.TIMED,
            "ms": ranked[0][0] if ranked else None,
            "runner_up_ms": ranked[1][0] if len(ranked) > 1 else None,
            "candidates_ms": {**{cid: ms for ms, cid in ranked}, **failed},
            "tune_s": round(tuning.seconds, 2),
            "workload": (workload_of or {}).get((tuning.kernel, tuning.key), ""),
            **{k: provenance.get(k, "") for k in ("gpu", "triton", "torch", "cuda", "git_commit", "utc")},
        })  # fmt: skip
    return list(tables.values())


def sm80_usable(results: dict) -> dict[tuple[str, str, str], dict]:
    """(kernel, key, config id) -> its compile result, for the configs usable at that key (a config
    is usable only if every compile of it at that key was)."""
    rows: dict[tuple[str, str, str], list] = {}
    for row in results["rows"]:
        rows.setdefault((row["kernel"], row["key"], row["config"]), []).append(row)
    return {k: v[0] for k, v in rows.items() if all(r["usable"] for r in v)}


def a100_table(h100: tt.ConfigTable, sm80_results: dict, kernels: dict, dtype: str) -> tt.ConfigTable:
    """The A100's table for ``dtype``, from the H100 table's candidates and the sm_80 compile check.
    ``kernels``: the registered autotuners by name (``tt.TUNER.kernels``), for configs by identity."""
    usable = sm80_usable(sm80_results)
    order = [(r["kernel"], r["key"], r["config"]) for r in sm80_results["rows"]]
    table = tt.ConfigTable("a100", dtype, meta={"built_from": h100.path.name if h100.path else "h100"})
    for kernel, by_key in h100.entries.items():
        if kernel not in kernels:  # flash2's tiles: not compiled by the check; an A100 keeps the code's
            logger.info("a100 table: %s is not an autotuned kernel; no A100 entry", kernel)
            continue
        for key, entry in by_key.items():
            timed = {
                c: ms
                for c, ms in entry.get("candidates_ms", {}).items()
                if ms is not None and (kernel, key, c) in usable
            }
            if timed:
                cid = min(timed, key=timed.get)
            else:
                cid = next(
                    (c for k, kk, c in order if (k, kk) == (kernel, key) and (k, kk, c) in usable), None
                )
            config = kernels[kernel].config_named(cid) if cid else None
            if config is None:
                logger.warning(
                    "a100 table: no usable sm_80 config for %s at %s; an A100 tunes it", kernel, key
                )
                continue
            compiled = usable[kernel, key, cid]
            table.put(kernel, key, {
                "config": tt.config_to_json(config),
                "status": tt.COMPILED_NOT_TIMED,
                "ms": None,
                "runner_up_ms": None,
                "h100_ms": timed.get(cid),
                "h100_pick_ms": entry.get("ms"),
                "sm80": {k: compiled[k] for k in ("registers", "spill_stores", "spill_loads", "shared_bytes")},
                **{k: entry.get(k, "") for k in ("triton", "torch", "git_commit", "utc", "workload")},
            })  # fmt: skip
    return table


def load_sm80(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        logger.warning("%s: no usable sm_80 compile results (%s); no A100 table is built", path, e)
        return None
