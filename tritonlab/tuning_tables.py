"""Tuned configs kept per GPU and dtype: the tables, their lookup, and the autotuner that uses them.

Every autotuned kernel of the library is built with :func:`autotune` (``triton.autotune``'s
arguments plus a name, a phase and how its key is bucketed), which registers it in :data:`TUNER`.
When such a kernel meets an autotuning key that is new to the process, its config comes from,
in this order:

1. **the bucket's pick in this process.** Keys are bucketed -- lengths to powers of two (the
   attention kernels' keys are already powers-of-4 buckets), model dims and flags as they are, the
   dtypes of every tensor argument -- so a new length or a new call signature in a bucket that
   already has a pick launches that pick, without timing;
2. **the table** for this GPU and the call's dtype, ``tritonlab/tables/<gpu>_<dtype>.json``
   (``h100_bf16``, ``a100_bf16``, ...), written by ``python -m phases 11`` on that GPU;
3. **Triton's autotuner**, exactly as without tables: every candidate the kernel's prune keeps is
   timed once per bucket. The miss is said once, as a warning on logger "tritonlab": per kernel
   when the GPU has a table without its entry, per GPU and dtype when there is no table at all.

``TRITONLAB_AUTOTUNE`` chooses: ``table`` (the default: all three), ``full`` (ignore the tables:
1 and 3, a fresh tune per bucket) or ``off`` (no timing at all: each kernel's default, the first
config its prune keeps). A bad value is a ``ValueError`` at the first launch that reads it.
Triton's own result cache (``TRITON_CACHE_AUTOTUNING=1``) still applies to step 3, except under
``full``, which always times afresh.

A table that cannot be read (bad JSON, a missing field, another schema) is ignored with one warning
naming the file; an entry whose config is no longer in the kernel's search space is ignored with
one warning naming the file, kernel and key. Neither ever fails a launch: the kernel tunes instead.

A kernel whose settings are a table in its code rather than an autotuner (FlashAttention-2's
tiles) asks :meth:`Tuner.lookup` for the table's entry and keeps its code's settings otherwise.

Nothing here is module-global state except :data:`TUNER`, the one :class:`Tuner` of the process,
which holds the registered kernels, the tables read so far, the picks per bucket and what was timed.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
import triton
from triton.runtime.autotuner import Autotuner

from ._runtime import next_power_of_2

logger = logging.getLogger("tritonlab")

ENV_VAR = "TRITONLAB_AUTOTUNE"
MODES = ("off", "table", "full")
SCHEMA = 1
TABLE_DIR = Path(__file__).resolve().parent / "tables"
# An entry's status: measured on its GPU, or (the A100's) chosen from another GPU's timings among
# the configs that compile for sm_80 without spills, never timed on an A100.
TIMED = "timed"
COMPILED_NOT_TIMED = "compiled for sm_80, not timed"
STATUSES = (TIMED, COMPILED_NOT_TIMED)
DTYPE_NAMES = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.float8_e4m3fn: "fp8",
    torch.float8_e5m2: "fp8",
}
# GPU families by a substring of the device name; any other GPU is named by its slugged name.
GPU_FAMILIES = ("h200", "h100", "a100", "l40s", "l4")


def autotune_mode(environ: Mapping[str, str] | None = None) -> str:
    """``TRITONLAB_AUTOTUNE``: "off", "table" (the default) or "full"; a ``ValueError`` otherwise."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "table").strip().lower()
    if value not in MODES:
        raise ValueError(f"{ENV_VAR}: unknown value {value!r}; expected one of {', '.join(MODES)}")
    return value


def gpu_slug(device_name: str) -> str:
    """A short file-name part for a device: its family ("h100") or its name in lower case."""
    lowered = device_name.lower()
    family = next((f for f in GPU_FAMILIES if f in lowered), None)
    return family or "".join(ch if ch.isalnum() else "_" for ch in lowered).strip("_")


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def table_path(gpu: str, dtype: str, table_dir: Path = TABLE_DIR) -> Path:
    return Path(table_dir) / f"{gpu}_{dtype}.json"


# --- configs as JSON ------------------------------------------------------------------------------


def config_to_json(config: triton.Config) -> dict:
    return {
        "kwargs": dict(config.kwargs),
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
        "num_ctas": config.num_ctas,
        "maxnreg": config.maxnreg,
    }


def config_id(config: triton.Config | dict) -> str:
    """A config's identity as one sorted string, for matching a table's entry to the search space."""
    data = config if isinstance(config, dict) else config_to_json(config)
    kwargs = ",".join(f"{k}={data['kwargs'][k]}" for k in sorted(data["kwargs"]))
    extra = f"warps={data['num_warps']},stages={data['num_stages']}"
    extra += f",ctas={data.get('num_ctas', 1)},maxnreg={data.get('maxnreg')}"
    return f"{kwargs},{extra}" if kwargs else extra


# --- the table file ---------------------------------------------------------------------------------


class TableError(ValueError):
    """A table file that cannot be used; the message names the file."""


@dataclass
class ConfigTable:
    """One GPU and dtype: per kernel name and bucket key, an entry -- the config, its status, its
    time and the runner-up's (ms), the versions and the commit it was tuned with."""

    gpu: str
    dtype: str
    entries: dict[str, dict[str, dict]] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    path: Path | None = None

    def entry(self, kernel: str, key: str) -> dict | None:
        return self.entries.get(kernel, {}).get(key)

    def put(self, kernel: str, key: str, entry: dict) -> None:
        _check_entry(entry, f"entry {kernel} / {key}")
        self.entries.setdefault(kernel, {})[key] = entry

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "gpu": self.gpu, "dtype": self.dtype, **self.meta, "entries": self.entries}

    def save(self, path: Path | None = None) -> Path:
        path = Path(path or self.path or table_path(self.gpu, self.dtype))
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(text)
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: Path) -> ConfigTable:
        """The table in ``path``; a ``TableError`` naming the file if it cannot be used."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TableError(f"{path}: not a readable JSON table ({e})") from e
        if not isinstance(data, dict):
            raise TableError(f"{path}: expected a JSON object at the top")
        if data.get("schema") != SCHEMA:
            raise TableError(f"{path}: schema {data.get('schema')!r}, this tritonlab reads schema {SCHEMA}")
        for name in ("gpu", "dtype", "entries"):
            if name not in data:
                raise TableError(f"{path}: missing field {name!r}")
        entries = data["entries"]
        if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
            raise TableError(f"{path}: 'entries' must map kernel names to {{key: entry}} objects")
        for kernel, by_key in entries.items():
            for key, entry in by_key.items():
                try:
                    _check_entry(entry, f"entry {kernel} / {key}")
                except ValueError as e:
                    raise TableError(f"{path}: {e}") from e
        meta = {k: v for k, v in data.items() if k not in ("schema", "gpu", "dtype", "entries")}
        return cls(str(data["gpu"]), str(data["dtype"]), entries, meta, path)


def _check_entry(entry, where: str) -> None:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected an object, got {type(entry).__name__}")
    config = entry.get("config")
    if not (
        isinstance(config, dict)
        and isinstance(config.get("kwargs"), dict)
        and isinstance(config.get("num_warps"), int)
        and isinstance(config.get("num_stages"), int)
    ):
        raise ValueError(f"{where}: 'config' needs 'kwargs' (an object), 'num_warps' and 'num_stages' (ints)")
    if entry.get("status") not in STATUSES:
        raise ValueError(f"{where}: 'status' must be one of {STATUSES}, got {entry.get('status')!r}")


# --- kernels, buckets, and the process's tuning state ---------------------------------------------


def pow2_bucket(n: int) -> int:
    """Lengths to the next power of two: a training run's varying lengths share few buckets."""
    return next_power_of_2(max(int(n), 1))


@dataclass(frozen=True)
class KernelSpec:
    """What the tables need to know of an autotuned kernel: its name in a table ("attention.forward"),
    the phase that introduced it, its autotuning key, how each key argument is bucketed (absent:
    kept as is), the argument whose dtype names the table, and which configs an sm_80 GPU (A100)
    can run at all (no TMA, no FP8)."""

    name: str
    phase: str
    key: tuple[str, ...]
    dtype_arg: str
    buckets: Mapping[str, Callable[[int], int]] = field(default_factory=dict)
    runs_on_sm80: Callable[[triton.Config], bool] = lambda config: True


@dataclass
class Tuning:
    """One timed tuning: the kernel, its bucket key, the table it names, the pick and every
    candidate's median time in ms (inf where a candidate failed to compile or run)."""

    kernel: str
    key: str
    gpu: str
    dtype: str
    pick: triton.Config
    timings: dict[str, float]
    seconds: float


class Tuner:
    """The process's tuning state: registered kernels, tables read so far, a pick per bucket, and
    every tuning that timed candidates (``tunings``, for phase 11).

    ``device_name(tensor)`` names the GPU a call runs on (a test passes its own); ``table_dir`` is
    where tables are read from."""

    def __init__(self, table_dir: Path = TABLE_DIR, device_name: Callable[[torch.Tensor], str] | None = None):
        self.table_dir = Path(table_dir)
        self.device_name = device_name or _device_name
        self.kernels: dict[str, TableAutotuner] = {}
        self.picks: dict[tuple[str, str], triton.Config] = {}
        self.tunings: list[Tuning] = []
        # A tool that wants each launch's arguments instead of the launch (the sm_80 compile check):
        # called as intercept(autotuner, args, kwargs), its return value is the launch's.
        self.intercept: Callable | None = None
        # Direct-launch caches (tritonlab._launch.LaunchCache), which keep the compiled pick per call
        # signature: forgotten with the picks.
        self.launch_caches: list = []
        self._tables: dict[tuple[str, str], ConfigTable | None] = {}
        self._said: set = set()

    def register(self, kernel: TableAutotuner) -> None:
        name = kernel.spec.name
        if name in self.kernels and self.kernels[name] is not kernel:
            raise ValueError(f"name: a kernel named {name!r} is registered already")
        self.kernels[name] = kernel

    def forget(self) -> None:
        """Drop every pick, every autotuner's cache and every direct launch (tables are re-read
        lazily): the next launch of each bucket resolves again. For measurements and tests."""
        for cache in self.launch_caches:
            cache.clear()
        self.picks.clear()
        self.tunings.clear()
        self._tables.clear()
        self._said.clear()
        for kernel in self.kernels.values():
            kernel.cache.clear()

    def table(self, gpu: str, dtype: str) -> ConfigTable | None:
        """The table for ``gpu`` and ``dtype``, read once; None if there is none or it is unusable."""
        if (gpu, dtype) not in self._tables:
            path = table_path(gpu, dtype, self.table_dir)
            table = None
            if path.exists():
                try:
                    table = ConfigTable.load(path)
                except TableError as e:
                    logger.warning("ignoring a config table: %s; kernels tune as without one", e)
            else:
                dtypes = set(DTYPE_NAMES.values())
                known = sorted(
                    p.stem for p in self.table_dir.glob("*_*.json") if p.stem.rsplit("_", 1)[1] in dtypes
                )
                logger.warning(
                    "no tuned-config table for %s/%s (%s); kernels tune on first use. Tables: %s",
                    gpu, dtype, path, ", ".join(known) or "none",
                )  # fmt: skip
            self._tables[gpu, dtype] = table
        return self._tables[gpu, dtype]

    def resolve(
        self, kernel: TableAutotuner, key: str, gpu: str, dtype: str, default
    ) -> triton.Config | None:
        """The config for a bucket new to ``kernel``'s autotuner, or None to let it time candidates.
        ``default()`` gives the untuned default (mode "off")."""
        mode = autotune_mode()
        name = kernel.spec.name
        if mode == "off":
            return default()
        pick = self.picks.get((name, key))
        if pick is not None or mode == "full":
            return pick
        table = self.table(gpu, dtype)
        entry = table.entry(name, key) if table is not None else None
        if entry is not None:
            config = kernel.config_named(config_id(entry["config"]))
            if config is not None:
                self.picks[name, key] = config
                return config
            self.say_once(
                ("stale", table.path, name, key), logging.WARNING,
                "%s: the entry for %s at %s names a config outside its search space (stale table); tuning",
                table.path, name, key,
            )  # fmt: skip
        elif table is not None:
            self.say_once(
                ("miss", name, gpu, dtype), logging.WARNING,
                "%s: no entry in %s for %s; tuning it as without a table (once per bucket)",
                name, table.path, key,
            )  # fmt: skip
        return None

    def lookup(self, name: str, key: str, gpu: str, dtype: str) -> dict | None:
        """For a kernel that is not autotuned but launches settings from a table in code (flash2's
        tiles): the config of the table's entry for ``key`` under ``TRITONLAB_AUTOTUNE=table``, else
        None -- the code's own settings, which are also that kernel's "off" and "full"."""
        if autotune_mode() != "table":
            return None
        table = self.table(gpu, dtype)
        entry = table.entry(name, key) if table is not None else None
        return entry["config"] if entry is not None else None

    def note_tuned(self, tuning: Tuning) -> None:
        self.picks[tuning.kernel, tuning.key] = tuning.pick
        self.tunings.append(tuning)
        logger.info(
            "%s: tuned %s in %.1f s, picked %s",
            tuning.kernel,
            tuning.key,
            tuning.seconds,
            config_id(tuning.pick),
        )

    def say_once(self, what, level, message, *args) -> None:
        if what not in self._said:
            self._said.add(what)
            logger.log(level, message, *args)


def _device_name(t: torch.Tensor) -> str:
    if t.device.type != "cuda":
        return t.device.type
    return torch.cuda.get_device_name(t.device)


class TableAutotuner(Autotuner):
    """``triton.autotune``'s autotuner with the lookup of this module in front of its timing.

    Triton's own cache (per exact key) is kept: a key the autotuner has seen launches its config as
    before. For a key it has not seen, :meth:`Tuner.resolve` may supply the config, which goes into
    that cache, so Triton launches it without timing; otherwise Triton times the candidates as it
    always has, and the result becomes the bucket's pick."""

    def __init__(
        self, fn, spec: KernelSpec, tuner: Tuner, configs, reset_to_zero=None, restore_value=None, **kwargs
    ):
        super().__init__(fn, fn.arg_names, configs, list(spec.key), reset_to_zero, restore_value, **kwargs)
        missing = [k for k in (*spec.key, spec.dtype_arg) if k not in fn.arg_names]
        if missing:
            raise ValueError(f"{spec.name}: key or dtype_arg names {missing} are not arguments of the kernel")
        self.spec = spec
        self.tuner = tuner
        self._by_id = {config_id(c): c for c in self.configs}
        tuner.register(self)

    def config_named(self, identity: str) -> triton.Config | None:
        return self._by_id.get(identity)

    def _triton_key(self, all_args: dict) -> tuple:
        # Autotuner.run's cache key (the key arguments' values, then every dtype), rebuilt here to
        # find out before it runs whether Triton would time candidates.
        key = [all_args[k] for k in self.keys if k in all_args]
        key += [str(a.dtype) for a in all_args.values() if hasattr(a, "dtype")]
        return tuple(key)

    def bucket_key(self, all_args: dict) -> str:
        """The table's key of a call: each key argument bucketed, then the dtypes of the tensors."""
        parts = []
        for name in self.spec.key:
            value = all_args[name]
            bucket = self.spec.buckets.get(name)
            parts.append(f"{name}={bucket(value) if bucket else value}")
        dtypes = [
            dtype_name(a.dtype)
            for a in all_args.values()
            if isinstance(getattr(a, "dtype", None), torch.dtype)
        ]
        return ",".join(parts) + "|" + ",".join(dtypes)

    def _table_of(self, all_args: dict) -> tuple[str, str]:
        t = all_args[self.spec.dtype_arg]
        t = getattr(t, "base", t)  # a host TensorDescriptor names its tensor
        return gpu_slug(self.tuner.device_name(t)), dtype_name(t.dtype)

    def run(self, *args, **kwargs):
        if self.tuner.intercept is not None:
            return self.tuner.intercept(self, args, kwargs)
        if len(self.configs) < 2:
            return super().run(*args, **kwargs)
        all_args = {**dict(zip(self.arg_names, args, strict=False)), **kwargs}
        all_args = {k: v for k, v in all_args.items() if k in self.arg_names}
        triton_key = self._triton_key(all_args)
        timed = None
        if triton_key not in self.cache:
            key = self.bucket_key(all_args)
            gpu, dtype = self._table_of(all_args)

            def candidates():
                self.nargs = dict(zip(self.arg_names, args, strict=False))
                return self.prune_configs(kwargs)

            config = self.tuner.resolve(self, key, gpu, dtype, lambda: candidates()[0])
            if config is None:
                pruned = candidates()
                config = pruned[0] if len(pruned) == 1 else None  # nothing to time
            if config is not None:
                self.cache[triton_key] = config
            else:
                timed = (key, gpu, dtype)
        if timed is not None and self.cache_results and autotune_mode() == "full":
            # "full" promises a fresh tune: timings Triton cached on disk (TRITON_CACHE_AUTOTUNING)
            # would come back as if measured now, so this one run skips that cache.
            self.cache_results = False
            try:
                result = super().run(*args, **kwargs)
            finally:
                self.cache_results = True
        else:
            result = super().run(*args, **kwargs)
        if timed is not None and triton_key in self.cache:
            timings = {config_id(c): float(t[0] if isinstance(t, list | tuple) else t)
                       for c, t in getattr(self, "configs_timings", {}).items()}  # fmt: skip
            self.tuner.note_tuned(
                Tuning(self.spec.name, *timed, self.cache[triton_key], timings,
                       getattr(self, "bench_time", 0.0))
            )  # fmt: skip
        return result


TUNER = Tuner()


def autotune(
    configs: list,
    *,
    name: str,
    phase: str,
    key: list[str] | tuple[str, ...],
    dtype_arg: str,
    buckets: Mapping[str, Callable[[int], int]] | None = None,
    runs_on_sm80: Callable[[triton.Config], bool] | None = None,
    tuner: Tuner | None = None,
    **autotune_kwargs,
):
    """``triton.autotune(configs, key, **autotune_kwargs)`` whose kernel looks its config up in the
    tables first, registered under ``name`` (see the module docstring). ``buckets`` maps key
    arguments to their bucketing (``pow2_bucket`` for a length); ``runs_on_sm80`` says which configs
    an A100 can run (default: all)."""
    spec = KernelSpec(
        name, phase, tuple(key), dtype_arg, dict(buckets or {}), runs_on_sm80 or (lambda config: True)
    )

    def decorator(fn):
        return TableAutotuner(fn, spec, tuner or TUNER, configs, **autotune_kwargs)

    return decorator
