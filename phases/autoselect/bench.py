"""The cells of autoselect: per model size, selection cold and cached, the re-timed choices, what
selection adds to a cold start in fresh processes, and the LM trained three ways (all PyTorch, all
Triton, autoselected) on the same batches from the same initial weights.

Rows (``variant``): ``select-cold`` and ``select-cached`` (start-up seconds, ops chosen),
``choice`` (one per op and shape: the selection's times and choice, then both re-timed
independently: ``wrong_pick``), ``cold-start`` (``probe.py`` in fresh processes: the seconds from
the imports to the end of the first training step, without and with selection), and ``pytorch``,
``triton``, ``autoselect`` (per-step times, mean step time after the warm-up steps, tokens/s, the
loss of every step, ``order``: the three stepped in turn on each batch, or one after another when
their models do not fit in memory together).
"""

import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from common import DEVICE, ON_GPU
from common.device import autocast as device_autocast
from common.device import synchronize as sync
from common.timing import triton_compiles
from tritonlab import autoselect
from tritonlab.models import LM_SIZES, LMConfig, TransformerLM, our_components, param_count, random_batch
from tritonlab.models import torch_components as lm_torch_components

# The seed's small LLM: d_model 384, 8 heads of 48, sequence 256, batch 16 (6 layers, d_ff 4 x d).
SEED = LMConfig(384, 1536, 6, 8, context_length=256)
# The CPU's model: lm_bench's tiny, with a 512-token vocabulary so the interpreter's cross-entropy
# finishes in seconds.
CPU_TINY = replace(LM_SIZES["tiny"], vocab_size=512)
SIZES: dict[str, LMConfig] = {
    "seed": SEED,
    **{k: v for k, v in LM_SIZES.items() if k != "tiny"},
    "tiny": CPU_TINY,
}
GPU_SIZES = ("seed", "small", "medium")
CPU_SIZES = ("tiny",)
# (batch, context) per size: the seed's 16 x 256; lm_bench's batch 4 at context 512; tiny 2 x 16.
BATCH_CONTEXT = {"seed": (16, 256), "tiny": (2, 16)}
DEFAULT_BATCH_CONTEXT = (4, 512)
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
WAYS = ("pytorch", "triton", "autoselect")
LR = 1e-3
# Rounds of (PyTorch, autoselect) fresh processes in the cold-start row: one on the CPU keeps the
# tests fast; the interpreter measures nothing there anyway.
PROBE_REPEATS = 3 if ON_GPU else 1
REPO = Path(__file__).resolve().parents[2]


def autocast(dtype: str):
    """bf16: autocast over the fp32 weights; fp32: nothing."""
    return device_autocast(DTYPES[dtype])


@dataclass
class Plan:
    size: str
    dtype: str
    batch: int
    context: int
    steps: int
    warmup: int

    @property
    def cfg(self) -> LMConfig:
        return replace(SIZES[self.size], context_length=max(self.context, 1))

    def columns(self) -> dict:
        cfg = self.cfg
        return {
            "size": self.size,
            "batch": self.batch,
            "context": self.context,
            "steps": self.steps,
            "warmup": self.warmup,
            "d_model": cfg.d_model,
            "n_heads": cfg.n_heads,
            "head_dim": cfg.head_dim,
            "params": param_count(cfg),
        }


def build(plan: Plan, way: str) -> TransformerLM:
    """The model of ``way`` with the same initial weights: SDPA for PyTorch's attention."""
    torch.manual_seed(0)
    components = our_components() if way == "triton" else lm_torch_components("sdpa")
    with DEVICE:
        return TransformerLM(plan.cfg, components)


def batches(plan: Plan) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1234)
    return [random_batch(plan.cfg, plan.batch, plan.context, DEVICE, gen) for _ in range(plan.steps)]


def adamw(model: TransformerLM) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=LR)


def step(model: TransformerLM, optimizer: torch.optim.Optimizer, batch, dtype: str) -> tuple[float, float]:
    """One training step timed on its own, between two syncs: forward under autocast, backward,
    AdamW, zero_grad. Returns its milliseconds and loss."""
    tokens, targets = batch
    sync()
    started = time.perf_counter()
    with autocast(dtype):
        loss = model.loss(tokens, targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync()
    ms = (time.perf_counter() - started) * 1e3
    return ms, float(loss.detach())


def train(model: TransformerLM, data, dtype: str) -> tuple[list[float], list[float]]:
    """Forward, backward and AdamW per batch; returns each step's milliseconds and loss."""
    optimizer = adamw(model)
    steps = [step(model, optimizer, batch, dtype) for batch in data]
    return [ms for ms, _ in steps], [loss for _, loss in steps]


def rotation(i: int, ways: Sequence[str] = WAYS) -> list[str]:
    """The order the ways step in on batch ``i``: from way ``i % len(ways)`` round, so each goes
    first, second and last equally often."""
    k = i % len(ways)
    return [*ways[k:], *ways[:k]]


def model_for(plan: Plan, way: str, selection) -> TransformerLM:
    """``build(plan, way)``; for the autoselect way, with the selection's dispatchers swapped in."""
    if way == "autoselect" and selection is None:
        raise RuntimeError("no selection (see the select rows)")
    model = build(plan, way)
    return autoselect.apply(model, selection) if way == "autoselect" else model


def train_interleaved(plan: Plan, data, selection, ways: Sequence[str] = WAYS) -> dict[str, tuple | dict]:
    """The ways' models built together, each with its own AdamW, and on every batch each way's step
    in the order of :func:`rotation`: a drift of the host's speed falls on the three alike. Per way
    its (times, losses), or its failure's columns where it raised (it leaves the rotation, the
    others go on). A CUDA out-of-memory error goes up: the models do not fit together."""
    models, outcome = {}, {}
    for way in ways:
        try:
            models[way] = model_for(plan, way, selection)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as err:
            outcome[way] = failure(err)
    optimizers = {way: adamw(model) for way, model in models.items()}
    outcome |= {way: ([], []) for way in models}
    for i, batch in enumerate(data):
        for way in rotation(i, list(models)):
            try:
                ms, loss = step(models[way], optimizers[way], batch, plan.dtype)
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as err:
                outcome[way] = failure(err)
                del models[way], optimizers[way]
                continue
            outcome[way][0].append(ms)
            outcome[way][1].append(loss)
    return outcome


def train_sequential(plan: Plan, data, selection, ways: Sequence[str] = WAYS) -> dict[str, tuple | dict]:
    """The ways one after another, each model freed before the next is built; per way as
    :func:`train_interleaved`."""
    outcome = {}
    for way in ways:
        try:
            outcome[way] = train(model_for(plan, way, selection), data, plan.dtype)
        except Exception as err:
            outcome[way] = failure(err)
        free_memory()
    return outcome


# Where the three models do not fit together: the two whose ratio is the goal's, interleaved.
PAIR = ("pytorch", "autoselect")


def train_ways(plan: Plan, data, selection) -> list[dict]:
    """The ways' rows (``order``: how each was trained): the three interleaved where their models fit
    in memory together; else PyTorch and autoselect interleaved, then all-Triton alone; else (an
    out-of-memory error building or training them) one after another, each time from the start."""
    try:
        return way_rows(plan, train_interleaved(plan, data, selection), dict.fromkeys(WAYS, "interleaved"))
    except torch.cuda.OutOfMemoryError:
        pass  # they do not fit together; their models are freed with the error's frames
    free_memory()
    try:
        outcome = train_interleaved(plan, data, selection, PAIR)
        free_memory()
        outcome |= train_sequential(plan, data, selection, ("triton",))
        return way_rows(plan, outcome, {**dict.fromkeys(PAIR, "interleaved pair"), "triton": "alone"})
    except torch.cuda.OutOfMemoryError:
        pass
    free_memory()
    return way_rows(plan, train_sequential(plan, data, selection), dict.fromkeys(WAYS, "sequential"))


def way_rows(plan: Plan, outcome: dict[str, tuple | dict], order: dict[str, str]) -> list[dict]:
    """One row per way, in ``WAYS`` order, each loss curve against the PyTorch way's."""
    reference = outcome["pytorch"][1] if isinstance(outcome["pytorch"], tuple) else None
    rows = []
    for way in WAYS:
        got = outcome[way]
        columns = step_columns(plan, *got, reference) if isinstance(got, tuple) else got
        rows.append({"variant": way, "order": order[way], **columns})
    return rows


def free_memory() -> None:
    gc.collect()  # models still held by reference cycles (an exception's frames) go first
    if ON_GPU:
        torch.cuda.empty_cache()


def select_for(model: TransformerLM, plan: Plan, data, cache: Path, timer: Callable | None):
    with autocast(plan.dtype):
        return autoselect.select(model, data[0], mode="train", timer=timer, cache=cache)


def run_probe(plan: Plan, way: str, cache: Path | None = None, timeout: float = 600) -> dict:
    """One fresh process of ``probe.py`` for ``way`` at the plan's size; its JSON line."""
    cmd = [sys.executable, "-m", "phases.autoselect.probe", "--size", plan.size, "--way", way,
           "--dtype", plan.dtype, "--batch", str(plan.batch), "--context", str(plan.context)]  # fmt: skip
    if cache is not None:
        cmd += ["--cache", str(cache)]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        raise RuntimeError(f"probe --size {plan.size} --way {way} failed (exit {out.returncode}): {last}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def cold_start(plan: Plan, repeats: int) -> dict:
    """What selection adds to a cold start: fresh processes from their imports to the end of the
    first training step, PyTorch's against autoselect's (each with an empty selection cache), in
    ``repeats`` rounds after one autoselect process whose result is dropped -- it fills Triton's
    on-disk compile cache, as any earlier run on the machine would, so no compile is counted."""
    with tempfile.TemporaryDirectory(prefix="autoselect-probe-") as tmp:
        run_probe(plan, "autoselect", Path(tmp) / "warm-up.json")
        rounds = [
            (run_probe(plan, "pytorch"), run_probe(plan, "autoselect", Path(tmp) / f"round-{i}.json"))
            for i in range(repeats)
        ]
    pytorch, auto = [p for p, _ in rounds], [a for _, a in rounds]

    def median(runs: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    return {
        "start_pytorch_s": median(pytorch, "total_s"),
        "start_autoselect_s": median(auto, "total_s"),
        "select_adds_s": median(auto, "total_s") - median(pytorch, "total_s"),
        "select_s_probe": median(auto, "select_s"),
        "first_step_pytorch_s": median(pytorch, "first_step_s"),
        "first_step_autoselect_s": median(auto, "first_step_s"),
        "repeats": repeats,
        "start_pytorch_all_s": ";".join(f"{r['total_s']:.4f}" for r in pytorch),
        "start_autoselect_all_s": ";".join(f"{r['total_s']:.4f}" for r in auto),
    }


def cold_start_row(plan: Plan, repeats: int) -> dict:
    """The cold-start row: :func:`cold_start`'s columns, or the failure that stopped it."""
    try:
        return {"variant": "cold-start", **cold_start(plan, repeats)}
    except Exception as err:
        return {"variant": "cold-start", **failure(err)}


def run_size(plan: Plan, write: Callable[[dict], dict], timer: Callable | None = None) -> None:
    """Every row of one size; a failure of one part is a row and the rest goes on."""
    base = {"shape": plan.size, "dtype": plan.dtype, **plan.columns()}
    data = batches(plan)
    with tempfile.TemporaryDirectory(prefix="autoselect-cache-") as tmp:
        cache = Path(tmp) / "autoselect.json"  # empty: a cold start, whatever ~/.cache holds
        selection = select_rows(plan, data, cache, timer, lambda row: write({**base, **row}))
        write({**base, **cold_start_row(plan, PROBE_REPEATS)})
        for row in train_ways(plan, data, selection):
            write({**base, **row})


def select_rows(plan: Plan, data, cache: Path, timer: Callable | None, write: Callable[[dict], dict]):
    """The select-cold, select-cached and choice rows; returns the cold selection (None if it failed)."""
    selection = None
    model = build(plan, "autoselect")
    for variant in ("select-cold", "select-cached"):
        try:
            with triton_compiles() as compiles:  # on an empty Triton cache, the first compiles
                chosen = select_for(model, plan, data, cache, timer)
            selection = chosen if selection is None else selection
            n_triton = sum(c.choice == "triton" for c in chosen.choices.values())
            write({"variant": variant, "startup_s": chosen.startup_s, "forward_s": chosen.forward_s,
                   "ops_selected": len(chosen.choices), "ops_triton": n_triton,
                   "compile_s": compiles.compile_s, "kernels_compiled": compiles.compiled,
                   "kernels_loaded": compiles.loaded, "launcher_s": compiles.launcher_s,
                   "launchers_built": compiles.launchers_built})  # fmt: skip
        except Exception as err:
            write({"variant": variant, **failure(err)})
    del model
    free_memory()  # the fresh processes and the training runs later have the device to themselves
    if selection is None:
        return None
    print(selection.table())
    try:
        verified = autoselect.verify(selection, timer)
        for row in verified:
            write({"variant": "choice", **_choice_columns(row)})
        timed_keys = {(r["op"], r["shapes"]) for r in verified}
        for row in selection.rows():
            if (row["op"], row["shapes"]) not in timed_keys:
                write({"variant": "choice", **_choice_columns(row)})
    except Exception as err:
        write({"variant": "choice", **failure(err)})
    return selection


def _choice_columns(row: dict) -> dict:
    out = {k: v for k, v in row.items() if k not in ("dtype", "mode")}
    out["op_dtype"] = row["dtype"]
    return out


def step_columns(plan: Plan, times: list[float], losses: list[float], reference) -> dict:
    timed = times[plan.warmup :] or times
    mean = statistics.fmean(timed)
    row = {
        "mean_ms": mean,
        "std_ms": statistics.stdev(timed) if len(timed) > 1 else 0.0,
        "median_ms": statistics.median(timed),
        "first_ms": times[0],
        "tokens_per_s": plan.batch * plan.context / (mean * 1e-3),
        "final_loss": losses[-1],
        "step_times_ms": ";".join(f"{t:.4f}" for t in times),
        "losses": ";".join(f"{x:.5f}" for x in losses),
    }
    if reference is not None and len(reference) == len(losses):
        row["max_loss_rel_dev"] = max(
            abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference, strict=True)
        )
    return row


def failure(err: BaseException) -> dict:
    from common import failure_row

    return failure_row(err)
