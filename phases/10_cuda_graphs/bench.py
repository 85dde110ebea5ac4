"""Phase 10's cells: per shape and components, the plain (eager) training step and the same step
replayed from one CUDA graph (``tritonlab.graphs.GraphedStep``), checked against each other first.

Per shape and components, two cells run in order:

- **plain**: a reference run (``check_steps`` steps from the seed's weights on one fixed batch,
  keeping the losses and final parameters), then a second plain run from the same start whose first
  ``check_steps`` steps are compared with the reference -- the plain step's own run-to-run
  difference, zero where every kernel is deterministic -- and which then times ``steps`` steps after
  ``warmup`` more.
- **graphed**: a fresh model from the same seed with AdamW(fused=True, capturable=True) (the same
  hyper-parameters as the plain step's fused AdamW, whose arithmetic ``capturable`` leaves alone),
  captured by ``GraphedStep`` (its warm-up steps are undone), then ``check_steps`` replays compared
  with the reference -- bitwise if the plain runs agreed bitwise, else within :data:`LOSS_RTOL` and
  :data:`UPDATE_RTOL` -- then ``steps`` timed replays after ``warmup`` more. A graph that disagrees
  beyond tolerance is an error row (its timing would mean nothing); one that cannot be captured too.
  Without a GPU the cell is a row with status "skipped" naming why.

Each timed step is bracketed by CUDA events on the stream (``common.timing.StageTimer``): for the
plain step that includes the GPU's idle gaps while the host launches, which is the point.
"""

import dataclasses
import gc
from collections.abc import Callable
from typing import ClassVar

import torch

from common import ON_GPU, Cell, measure_peak_memory
from common.step import AT_LARGE, StepSetup, shape_columns
from common.timing import StageTimer
from tritonlab.models import Components, TNPConfig, TNPShape, build, check_dtype, sample_tasks, sdpa_attention
from tritonlab.models.training import train_step

# The model a machine without a GPU runs (as phase 09's): the spec's dims take seconds a step there.
CPU_CONFIG = TNPConfig(n_layers=2, n_heads=2, head_dim=16, d_ff=40, n_components=3, d_head_hidden=24)
# Tolerances where the plain step itself is not bitwise reproducible (a kernel with atomics):
# every step's loss within LOSS_RTOL relative, and the parameters' total update over the check steps,
# graphed against plain, within UPDATE_RTOL of its norm: ||Δθ_graph − Δθ_plain|| ≤ UPDATE_RTOL ||Δθ_plain||.
# bf16 rounding that differs between runs moves both far less than that; a graph that replays stale
# inputs, misses the optimizer step or the gradients is off by ~100%.
LOSS_RTOL = 1e-2
UPDATE_RTOL = 0.1


def model_config() -> TNPConfig:
    return TNPConfig() if ON_GPU else CPU_CONFIG


def _triton_components(attention: str) -> Components:
    # The kernels: imported only when a run asks for them.
    from tritonlab import attention as attn
    from tritonlab.gmm import gmm_nll
    from tritonlab.grouped_gemm import gmm_heads
    from tritonlab.mlp import fused_mlp

    fn = {"two-pass": attn.attention, "fused": attn.fused_attention}[attention]
    return Components(attention=fn, mlp=fused_mlp, heads=gmm_heads, loss=gmm_nll)


# --components: the TransformerNP's four components. sdpa-*: SDPA pinned to one backend (no silent
# fallback) with PyTorch's MLP, head loop and loss; triton: every component the library's kernel
# (attention with the deterministic two-pass backward, fused MLP, grouped heads, GMM loss);
# triton-fused: the same with the one-launch fused attention backward.
COMPONENTS: dict[str, Callable[[], Components]] = {
    "sdpa-cudnn": lambda: Components(attention=sdpa_attention("cudnn")),
    "sdpa-flash": lambda: Components(attention=sdpa_attention("flash")),
    "sdpa-math": lambda: Components(attention=sdpa_attention("math")),
    "triton": lambda: _triton_components("two-pass"),
    "triton-fused": lambda: _triton_components("fused"),
}


@dataclasses.dataclass(frozen=True)
class Setup(StepSetup):
    """``StepSetup`` with the steps compared, graphed against plain, before timing (2 at most at large)."""

    check_steps: int = 5
    at_large: ClassVar[dict[str, int]] = {**AT_LARGE, "check_steps": 2}


@dataclasses.dataclass
class Run:
    """What a few steps left: each step's loss and the parameters after them (and before)."""

    losses: list[float]
    start: list[torch.Tensor]
    params: list[torch.Tensor]


def _params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _tasks(shape: TNPShape, cfg: TNPConfig, seed: int):
    device = "cuda" if ON_GPU else "cpu"
    generator = torch.Generator(device=device).manual_seed(seed)
    return sample_tasks(
        shape.batch, shape.m_context, shape.n_target, x_dim=cfg.x_dim, device=device, generator=generator
    )


def _losses(step: Callable[[], torch.Tensor], n: int) -> list[float]:
    # The losses stay on the device until the end: no synchronisation between steps.
    return torch.stack([step().detach().clone().float() for _ in range(n)]).tolist()


def compare(run: Run, ref: Run) -> dict:
    """Loss and parameter differences of ``run`` against ``ref`` (the same start and batch)."""
    loss_diff = max((abs(a - b) for a, b in zip(run.losses, ref.losses, strict=True)), default=0.0)
    loss_rel = max(
        (abs(a - b) / max(abs(b), 1e-12) for a, b in zip(run.losses, ref.losses, strict=True)), default=0.0
    )
    param_diff, update_err, update_norm = 0.0, 0.0, 0.0
    bitwise = run.losses == ref.losses
    for p, q, p0 in zip(run.params, ref.params, ref.start, strict=True):
        d = (p.float() - q.float()).abs()
        param_diff = max(param_diff, float(d.max()))
        update_err += float(d.square().sum())
        update_norm += float((q.float() - p0.float()).square().sum())
        bitwise = bitwise and torch.equal(p, q)
    return {
        "bitwise": bitwise,
        "loss_max_diff": loss_diff,
        "loss_max_rel_diff": loss_rel,
        "max_param_diff": param_diff,
        "update_rel_diff": (update_err / update_norm) ** 0.5 if update_norm > 0 else float(update_err > 0),
    }


def judge(graphed: dict, plain_noise: dict) -> str:
    """The validation's verdict; an AssertionError (an error row) if the graph is wrong."""
    if graphed["bitwise"]:
        return "bitwise"
    detail = (
        f"loss rel diff {graphed['loss_max_rel_diff']:.3g} (tolerance {LOSS_RTOL:g}), parameter update rel "
        f"diff {graphed['update_rel_diff']:.3g} (tolerance {UPDATE_RTOL:g}), max |Δθ| {graphed['max_param_diff']:.3g}"
    )
    if graphed["loss_max_rel_diff"] > LOSS_RTOL or not graphed["update_rel_diff"] <= UPDATE_RTOL:
        raise AssertionError(f"validation: the graphed step disagrees with the plain step: {detail}")
    if plain_noise["bitwise"]:
        return "within tolerance, NOT bitwise although the plain step is"
    return "within tolerance (the plain step is not bitwise reproducible either)"


def _free() -> None:
    gc.collect()
    if ON_GPU:
        torch.cuda.empty_cache()


def _timed(step: Callable[[], object], steps: int) -> dict:
    timer = StageTimer()
    for _ in range(steps):
        with timer.stage("step"):
            step()
    t = timer.summary()["step"]
    return {"step_ms": t.ms, "step_p20_ms": t.p20_ms, "step_p80_ms": t.p80_ms, "steps": steps}


def _graphed_optimizer(model, plain_optimizer) -> torch.optim.Optimizer:
    d = plain_optimizer.defaults
    return torch.optim.AdamW(
        model.parameters(), lr=d["lr"], betas=d["betas"], eps=d["eps"], weight_decay=d["weight_decay"],
        fused=True, capturable=True,
    )  # fmt: skip


def shape_cells(setup: Setup, shape: TNPShape, components: str) -> list[Cell]:
    """The plain and the graphed cell of one shape and components; the graphed one reads what the
    plain one left (its reference run and step time), so they run in this order."""
    setup = setup.for_shape(shape)
    dtype = check_dtype(setup.dtype)
    shared: dict = {}
    columns = {
        "components": components,
        **shape_columns(setup.cfg, shape),
        "check_steps": setup.check_steps,
    }

    def fresh():
        model, optimizer = build(setup.cfg, COMPONENTS[components](), setup.seed)
        return model, optimizer

    def reference() -> Run:
        model, optimizer = fresh()
        start = _params(model)
        tasks = _tasks(shape, setup.cfg, setup.seed)
        losses = _losses(lambda: train_step(model, model.loss, optimizer, tasks, dtype), setup.check_steps)
        return Run(losses, start, _params(model))

    def plain_run(ref: Run) -> tuple[Run, dict]:
        model, optimizer = fresh()
        tasks = _tasks(shape, setup.cfg, setup.seed)

        def step():
            return train_step(model, model.loss, optimizer, tasks, dtype)

        again = Run(_losses(step, setup.check_steps), ref.start, _params(model))
        for _ in range(setup.warmup):
            step()
        return again, _timed(step, setup.steps)

    def graphed_run(ref: Run) -> tuple[Run, dict]:
        from tritonlab.graphs import GraphedStep

        model, plain_optimizer = fresh()
        optimizer = _graphed_optimizer(model, plain_optimizer)
        tasks = _tasks(shape, setup.cfg, setup.seed)
        graphed = GraphedStep(model, optimizer, model.loss, tasks, warmup=setup.warmup, autocast_dtype=dtype)

        def step():
            return graphed.step(*tasks)

        run = Run(_losses(step, setup.check_steps), ref.start, _params(model))
        validation = judge(compare(run, ref), shared["noise"])  # before timing: a wrong graph is not timed
        for _ in range(setup.warmup):
            step()
        return run, {**_timed(step, setup.steps), "validation": validation}

    def plain() -> dict:
        shared["ref"] = ref = reference()
        _free()
        with measure_peak_memory() as mem:
            again, row = plain_run(ref)
        _free()
        shared["noise"] = noise = compare(again, ref)
        shared["step_ms"] = row["step_ms"]
        return {
            **row,
            "tokens_per_s": shape.tokens / (row["step_ms"] / 1e3),
            "peak_mem_gb": (mem.peak_bytes - mem.start_bytes) / 1e9,
            "speedup_vs_plain": 1.0,
            "loss": ref.losses[-1],
            "deterministic": noise["bitwise"],
            "max_param_diff": noise["max_param_diff"],
            "loss_max_diff": noise["loss_max_diff"],
            "update_rel_diff": noise["update_rel_diff"],
            "validation": "reference" if noise["bitwise"] else "reference (not bitwise reproducible)",
        }

    def graphed() -> dict:
        if not ON_GPU:
            return {
                "status": "skipped",
                "error": "CUDA graphs need a CUDA GPU: the CPU run times the plain step only",
            }
        if "noise" not in shared:
            raise RuntimeError("no plain reference: the plain cell of this shape failed")
        ref = shared["ref"]
        with measure_peak_memory() as mem:
            run, row = graphed_run(ref)
        _free()
        result = compare(run, ref)
        return {
            **row,
            "tokens_per_s": shape.tokens / (row["step_ms"] / 1e3),
            "peak_mem_gb": (mem.peak_bytes - mem.start_bytes) / 1e9,
            "speedup_vs_plain": shared["step_ms"] / row["step_ms"],
            "loss": run.losses[-1],
            "deterministic": shared["noise"]["bitwise"],
            **result,
        }

    return [
        Cell(f"plain+{components}", shape.name, setup.dtype, plain, {"graph": "plain", **columns}),
        Cell(f"graphed+{components}", shape.name, setup.dtype, graphed, {"graph": "graphed", **columns}),
    ]
