"""The cells of autoselect: per model size, selection cold and cached, the re-timed choices, and the
LM trained three ways (all PyTorch, all Triton, autoselected) on the same batches from the same
initial weights.

Rows (``variant``): ``select-cold`` and ``select-cached`` (start-up seconds, ops chosen),
``choice`` (one per op and shape: the selection's times and choice, then both re-timed
independently: ``wrong_pick``), and ``pytorch``, ``triton``, ``autoselect`` (per-step times, mean
step time after the warm-up steps, tokens/s, the loss of every step).
"""

import statistics
import tempfile
import time
from collections.abc import Callable
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


def train(model: TransformerLM, data, dtype: str) -> tuple[list[float], list[float]]:
    """Forward, backward and AdamW per batch; returns each step's milliseconds and loss."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    times, losses = [], []
    for tokens, targets in data:
        sync()
        started = time.perf_counter()
        with autocast(dtype):
            loss = model.loss(tokens, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        times.append((time.perf_counter() - started) * 1e3)
        losses.append(float(loss.detach()))
    return times, losses


def select_for(model: TransformerLM, plan: Plan, data, cache: Path, timer: Callable | None):
    with autocast(plan.dtype):
        return autoselect.select(model, data[0], mode="train", timer=timer, cache=cache)


def run_size(plan: Plan, write: Callable[[dict], dict], timer: Callable | None = None) -> None:
    """Every row of one size; a failure of one part is a row and the rest goes on."""
    base = {"shape": plan.size, "dtype": plan.dtype, **plan.columns()}
    data = batches(plan)
    selection = None
    with tempfile.TemporaryDirectory(prefix="autoselect-cache-") as tmp:
        cache = Path(tmp) / "autoselect.json"  # empty: a cold start, whatever ~/.cache holds
        model = build(plan, "autoselect")
        for variant in ("select-cold", "select-cached"):
            try:
                with triton_compiles() as compiles:  # on an empty Triton cache, the first compiles
                    chosen = select_for(model, plan, data, cache, timer)
                selection = chosen if selection is None else selection
                n_triton = sum(c.choice == "triton" for c in chosen.choices.values())
                write({**base, "variant": variant, "startup_s": chosen.startup_s, "forward_s": chosen.forward_s,
                       "ops_selected": len(chosen.choices), "ops_triton": n_triton,
                       "compile_s": compiles.compile_s, "kernels_compiled": compiles.compiled,
                       "kernels_loaded": compiles.loaded, "launcher_s": compiles.launcher_s,
                       "launchers_built": compiles.launchers_built})  # fmt: skip
            except Exception as err:
                write({**base, "variant": variant, **failure(err)})
        if selection is not None:
            print(selection.table())
            try:
                verified = autoselect.verify(selection, timer)
                for row in verified:
                    write({**base, "variant": "choice", **_choice_columns(row)})
                timed_keys = {(r["op"], r["shapes"]) for r in verified}
                for row in selection.rows():
                    if (row["op"], row["shapes"]) not in timed_keys:
                        write({**base, "variant": "choice", **_choice_columns(row)})
            except Exception as err:
                write({**base, "variant": "choice", **failure(err)})
        reference = None
        for way in WAYS:
            try:
                model = build(plan, way)
                if way == "autoselect":
                    if selection is None:
                        raise RuntimeError("no selection (see the select rows)")
                    autoselect.apply(model, selection)
                times, losses = train(model, data, plan.dtype)
                reference = losses if way == "pytorch" else reference
                write({**base, "variant": way, **step_columns(plan, times, losses, reference)})
            except Exception as err:
                write({**base, "variant": way, **failure(err)})
            del model
            if ON_GPU:
                torch.cuda.empty_cache()


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
