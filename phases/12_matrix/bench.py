"""Phase 12's cells: the TransformerNP's training step per variant, checked, trained, then timed.

Per shape, checkpoint mode and graph toggle, each variant's cell runs in this order:

1. **Correctness**: from the seed's weights and one fixed batch, one forward and backward; the loss
   and every parameter's gradient must match the reference model's (``sdpa-cudnn`` on a GPU,
   ``sdpa-math`` on the CPU; no checkpointing, eager) within :func:`tolerances` -- else the cell is
   an error row and is neither trained nor timed.
2. **Loss curve**: ``loss_steps`` steps of AdamW on fresh synthetic tasks each step (the same task
   stream for every variant); each step's loss goes into the row, ';'-joined.
3. **Timing**: ``warmup`` steps, then ``steps`` timed ones (median and p20/p80 of the whole step and
   of forward, backward and the optimizer, as ``common.step.measure_training_step`` times them), peak
   memory, tokens/s = B·(M+N) / step time. A graphed cell replays the step from one CUDA graph
   (``tritonlab.graphs.GraphedStep``): its stages are not separable, only the step is timed.
4. **GPU time by component** (on a GPU): ``profile_steps`` more steps under ``torch.profiler``; the
   GPU's busy time a step and its kernel time by family (``common.step.profile_gpu_time``).

Speedups are against ``sdpa-cudnn`` (eager) and the best baseline measured earlier in the same run
at the same shape, checkpoint mode and graph toggle (baselines run first).
"""

import dataclasses
import functools
import gc
from collections.abc import Callable
from typing import ClassVar

import torch

from common import ON_GPU, Cell, measure_peak_memory
from common.step import AT_LARGE, StepSetup, profile_gpu_time, shape_columns, variant_label
from common.timing import StageTimer
from tritonlab.models import Components, TNPConfig, TNPShape, build, check_dtype, sample_tasks, sdpa_attention
from tritonlab.models.training import train_step

# The model a machine without a GPU runs (as phases 09 and 10): the spec's dims take seconds a step there.
CPU_CONFIG = TNPConfig(n_layers=2, n_heads=2, head_dim=16, d_ff=40, n_components=3, d_head_hidden=24)

BASELINES = ["sdpa-cudnn", "sdpa-flash", "compile+sdpa-cudnn", "compile+sdpa-flash"]
CUSTOM = [
    "custom-bf16-separate",
    "custom-bf16-fused",
    "custom-bf16-mixed",
    "custom-bf16-padded",
    "custom-fp8-fused",
    "compile+custom-bf16-separate",
    "compile+custom-bf16-fused",
    "compile+custom-bf16-mixed",
    "compile+custom-bf16-padded",
    "compile+custom-fp8-fused",
]
# sdpa-math: the CPU's reference and baseline (cuDNN and flash SDPA need a CUDA GPU).
VARIANTS = [*BASELINES, "sdpa-math", *CUSTOM]
REFERENCE = "sdpa-cudnn" if ON_GPU else "sdpa-math"

# Correctness tolerances, per dtype: |loss − loss_ref| ≤ LOSS_RTOL·|loss_ref|, and per parameter
# ||g − g_ref||₂ ≤ GRAD_RTOL·||g_ref||₂ + GRAD_ATOL·sqrt(numel) (the absolute term for parameters
# whose gradient is ~0). bf16 autocast rounds every matmul input to 8 bits of mantissa: two correct
# implementations differ by ~1e-2 relative in the loss's gradients; a wrong kernel by ~1.
TOLERANCES = {
    "bf16": {"loss_rtol": 2e-2, "grad_rtol": 5e-2, "grad_atol": 1e-5},
    "fp32": {"loss_rtol": 1e-4, "grad_rtol": 1e-3, "grad_atol": 1e-7},
}


def tolerances(dtype: str) -> dict:
    return TOLERANCES[dtype]


def model_config() -> TNPConfig:
    return TNPConfig() if ON_GPU else CPU_CONFIG


def is_baseline(variant: str) -> bool:
    return variant in BASELINES or variant == "sdpa-math"


def _triton_components(attention: str) -> Components:
    # The kernels: imported only when a run asks for them.
    from tritonlab import attention as attn
    from tritonlab.gmm import gmm_nll
    from tritonlab.grouped_gemm import gmm_heads
    from tritonlab.mlp import fused_mlp, padded_cublas_mlp

    # mixed: SDPA's attention (cuDNN; the CPU's math) with our MLP, heads and loss -- at small the
    # attention is a few percent of the step, and the rest is where our kernels beat compile's.
    mixed = sdpa_attention("cudnn" if ON_GPU else "math")
    # fp8: phase 05's FP8 forward with a bf16 backward (the fused one on Hopper); force_fp8, so a GPU without FP8
    # is an error row rather than a bf16 run under this name (skip_reason keeps such cells out).
    fp8 = functools.partial(attn.fp8_attention, force_fp8=True)
    if attention == "padded":
        # The fused attention and our loss; the MLP as two cuBLAS GEMMs on weights whose d_ff is padded
        # to 1376 (phase 06's padded-cublas: in the compiled step at small the GPU's work falls from
        # 23.5 to 21.0 ms against the fused MLP kernel, diagnostics/step_profile_small_padded_*), and
        # the heads keeping their pre-activation (phase 07's grouped-save: 4.05 against 4.84 ms at
        # small, for 880 MB).
        heads = functools.partial(gmm_heads, save_preactivation=True)
        return Components(
            attention=attn.fused_attention,
            attention_kv=attn.fused_attention_kv,
            mlp=padded_cublas_mlp,
            heads=heads,
            loss=gmm_nll,
        )
    fn = {"separate": attn.attention, "fused": attn.fused_attention, "mixed": mixed, "fp8": fp8}[attention]
    # The fused attention takes K and V packed as W_KV projects them (no copy interleaving their
    # gradients; tritonlab.attention.fused_attention_kv).
    packed = attn.fused_attention_kv if attention == "fused" else None
    return Components(attention=fn, attention_kv=packed, mlp=fused_mlp, heads=gmm_heads, loss=gmm_nll)


def components(variant: str) -> Components:
    """The model's four components for ``variant`` (without its ``compile+`` prefix)."""
    base = variant.removeprefix("compile+")
    if base.startswith("sdpa-"):
        return Components(attention=sdpa_attention(base.removeprefix("sdpa-")))
    if base == "custom-fp8-fused":
        return _triton_components("fp8")
    return _triton_components(base.rsplit("-", 1)[-1])


def fp8_skip_reason(dtype: str) -> str | None:
    """Why the FP8 variant cannot run here, or None: FP8 attention needs a GPU with FP8 (compute
    capability >= 8.9; elsewhere it would run the bf16 kernels, which custom-bf16-separate measures)
    and 16-bit inputs (the bf16 autocast run)."""
    from tritonlab.attention import supports_fp8

    if not supports_fp8():
        where = torch.cuda.get_device_name() if ON_GPU else "the CPU"
        return (
            f"FP8 attention needs compute capability >= 8.9 (H100); on {where} fp8_attention would run "
            "the bf16 kernels, which custom-bf16-separate already measures"
        )
    if dtype != "bf16":
        return f"FP8 attention takes bf16 or fp16 inputs: run with --dtype bf16, not {dtype}"
    return None


def skip_reason(variant: str, graphs: bool, dtype: str) -> str | None:
    """Why a cell cannot run here (a "skipped" row), or None."""
    base = variant.removeprefix("compile+")
    if base == "custom-fp8-fused" and fp8_skip_reason(dtype):
        return fp8_skip_reason(dtype)
    if not ON_GPU:
        if base in ("sdpa-cudnn", "sdpa-flash"):
            return f"{base}: SDPA's {base[5:]} backend needs a CUDA GPU (the CPU's baseline is sdpa-math)"
        if graphs:
            return "CUDA graphs need a CUDA GPU"
        if variant.startswith("compile+"):
            return "torch.compile is not run on the CPU: its C++ build of the model takes minutes there"
    return None


@dataclasses.dataclass(frozen=True)
class Setup(StepSetup):
    """``StepSetup`` with the loss curve's training steps (10 at most at large)."""

    loss_steps: int = 200
    profile_steps: int = 3
    at_large: ClassVar[dict[str, int]] = {**AT_LARGE, "loss_steps": 10, "profile_steps": 1}


def _device() -> str:
    return "cuda" if ON_GPU else "cpu"


def _tasks(shape: TNPShape, cfg: TNPConfig, generator: torch.Generator):
    return sample_tasks(
        shape.batch, shape.m_context, shape.n_target, x_dim=cfg.x_dim, device=_device(), generator=generator
    )


def _free() -> None:
    gc.collect()
    if ON_GPU:
        torch.cuda.empty_cache()


def loss_fn_of(model, variant: str) -> Callable:
    """``model.loss``, compiled for a ``compile+`` variant: a fresh static compilation; our kernels
    must compose without graph breaks (fullgraph=True), so a break is an error row naming it."""
    if not variant.startswith("compile+"):
        return model.loss
    torch._dynamo.reset()
    return torch.compile(model.loss, dynamic=False, fullgraph=variant.startswith("compile+custom"))


@dataclasses.dataclass
class Grads:
    loss: float
    grads: dict[str, torch.Tensor | None]


def loss_and_grads(setup: Setup, shape: TNPShape, variant: str, checkpoint: str) -> Grads:
    """One forward and backward from the seed's weights on the seed's batch."""
    model, _ = build(setup.cfg, components(variant), setup.seed, _device(), checkpoint=checkpoint)
    loss_fn = loss_fn_of(model, variant)
    tasks = _tasks(shape, setup.cfg, torch.Generator(device=_device()).manual_seed(setup.seed))
    with torch.autocast(
        _device(), dtype=check_dtype(setup.dtype), enabled=check_dtype(setup.dtype) is not None
    ):
        loss = loss_fn(*tasks)
    loss.backward()
    grads = {
        n: None if p.grad is None else p.grad.detach().float().clone() for n, p in model.named_parameters()
    }
    return Grads(float(loss.detach()), grads)


def compare(got: Grads, ref: Grads, dtype: str) -> dict:
    """Loss and gradient differences against the reference; an AssertionError beyond tolerance."""
    tol = tolerances(dtype)
    loss_rel = abs(got.loss - ref.loss) / max(abs(ref.loss), 1e-12)
    worst, worst_name, bad = 0.0, "", []
    for name, g_ref in ref.grads.items():
        g = got.grads.get(name)
        if g is None or g_ref is None:
            if (g is None) != (g_ref is None):
                bad.append(f"{name}: gradient {'missing' if g is None else 'unexpected'}")
            continue
        err = float((g - g_ref).norm())
        bound = tol["grad_rtol"] * float(g_ref.norm()) + tol["grad_atol"] * g_ref.numel() ** 0.5
        rel = err / max(float(g_ref.norm()), 1e-30)
        if rel > worst:
            worst, worst_name = rel, name
        if not err <= bound:
            bad.append(f"{name}: grad rel err {rel:.3g}")
    if not loss_rel <= tol["loss_rtol"]:
        bad.insert(0, f"loss rel err {loss_rel:.3g} (tolerance {tol['loss_rtol']:g})")
    if bad:
        raise AssertionError(
            f"correctness against {REFERENCE}: "
            + "; ".join(bad[:4])
            + (f" (+{len(bad) - 4} more)" if len(bad) > 4 else "")
            + f" (grad tolerance {tol['grad_rtol']:g} relative)"
        )
    return {"loss_rel_err": loss_rel, "grad_max_rel_err": worst, "grad_worst_param": worst_name}


def loss_curve(setup: Setup, shape: TNPShape, variant: str, checkpoint: str) -> list[float]:
    """``loss_steps`` training steps on fresh tasks (the same stream for every variant)."""
    if setup.loss_steps == 0:
        return []
    model, optimizer = build(setup.cfg, components(variant), setup.seed, _device(), checkpoint=checkpoint)
    loss_fn = loss_fn_of(model, variant)
    generator = torch.Generator(device=_device()).manual_seed(setup.seed + 1)
    dtype = check_dtype(setup.dtype)
    losses = [train_step(model, loss_fn, optimizer, _tasks(shape, setup.cfg, generator), dtype)
              for _ in range(setup.loss_steps)]  # fmt: skip
    return torch.stack(losses).float().tolist()


def loss_lowered(curve: list[float]) -> bool | str:
    """Whether the last tenth of the curve averages below its first tenth ('' under 10 steps)."""
    if len(curve) < 10:
        return ""
    k = max(1, len(curve) // 10)
    return sum(curve[-k:]) / k < sum(curve[:k]) / k


def timed_eager(setup: Setup, shape: TNPShape, variant: str, checkpoint: str) -> dict:
    """``measure_training_step``'s measurement, with the variant's own compilation."""
    dtype = check_dtype(setup.dtype)
    tasks = _tasks(shape, setup.cfg, torch.Generator(device=_device()).manual_seed(setup.seed))
    with measure_peak_memory() as mem:
        model, optimizer = build(setup.cfg, components(variant), setup.seed, _device(), checkpoint=checkpoint)
        loss_fn = loss_fn_of(model, variant)
        for _ in range(setup.warmup):
            train_step(model, loss_fn, optimizer, tasks, dtype)
        timer = StageTimer()
        for _ in range(setup.steps):
            train_step(model, loss_fn, optimizer, tasks, dtype, timer)
        stages = timer.summary()
        gpu = profile_gpu_time(
            lambda: train_step(model, loss_fn, optimizer, tasks, dtype), setup.profile_steps
        )
    step = stages["step"]
    return {
        "step_ms": step.ms,
        "step_p20_ms": step.p20_ms,
        "step_p80_ms": step.p80_ms,
        "forward_ms": stages["forward"].ms,
        "backward_ms": stages["backward"].ms,
        "optimizer_ms": stages["optimizer"].ms,
        "peak_mem_gb": mem.peak_gb,
        **gpu,
    }


def timed_graphed(setup: Setup, shape: TNPShape, variant: str, checkpoint: str, ref_loss: float) -> dict:
    """The step replayed from one CUDA graph; its first replay's loss (the model's first step from
    the seed's weights on the seed's batch) must match the reference loss first."""
    from tritonlab.graphs import GraphedStep

    dtype = check_dtype(setup.dtype)
    tasks = _tasks(shape, setup.cfg, torch.Generator(device=_device()).manual_seed(setup.seed))
    with measure_peak_memory() as mem:
        model, plain = build(setup.cfg, components(variant), setup.seed, _device(), checkpoint=checkpoint)
        d = plain.defaults
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=d["lr"], betas=d["betas"], eps=d["eps"], weight_decay=d["weight_decay"],
            fused=True, capturable=True,
        )  # fmt: skip
        # A compiled variant's warm-up compiles the loss; the capture then records the compiled
        # kernels and our custom ops like any others (nothing in either syncs with the host).
        graphed = GraphedStep(
            model,
            optimizer,
            loss_fn_of(model, variant),
            tasks,
            warmup=max(1, setup.warmup),
            autocast_dtype=dtype,
        )
        first = float(graphed.step(*tasks))
        rel = abs(first - ref_loss) / max(abs(ref_loss), 1e-12)
        if not rel <= tolerances(setup.dtype)["loss_rtol"]:
            raise AssertionError(f"the graph's first replay: loss rel err {rel:.3g} against {REFERENCE}")
        for _ in range(setup.warmup):
            graphed.step(*tasks)
        timer = StageTimer()
        for _ in range(setup.steps):
            with timer.stage("step"):
                graphed.step(*tasks)
        step = timer.summary()["step"]
        gpu = profile_gpu_time(lambda: graphed.step(*tasks), setup.profile_steps)
    nan = float("nan")
    return {
        "step_ms": step.ms,
        "step_p20_ms": step.p20_ms,
        "step_p80_ms": step.p80_ms,
        "forward_ms": nan,
        "backward_ms": nan,
        "optimizer_ms": nan,
        "peak_mem_gb": mem.peak_gb,
        **gpu,
    }


def shape_cells(
    setup: Setup, shape: TNPShape, variants: list[str], checkpoints: list[str], graph_toggles: list[bool]
) -> list[Cell]:
    """Every cell of one shape; baselines first, so the custom cells' speedups have them to divide."""
    setup = setup.for_shape(shape)
    shared: dict = {}
    order = sorted(variants, key=lambda v: (not is_baseline(v), VARIANTS.index(v)))
    columns = {**shape_columns(setup.cfg, shape), "loss_steps": setup.loss_steps}

    def reference() -> Grads:
        if "ref" not in shared:
            shared["ref"] = loss_and_grads(setup, shape, REFERENCE, "none")
            _free()
        return shared["ref"]

    def cell(variant: str, checkpoint: str, graphs: bool) -> Cell:
        key = (checkpoint, graphs)

        def run() -> dict:
            reason = skip_reason(variant, graphs, setup.dtype)
            if reason:
                return {"status": "skipped", "error": reason}
            ref = reference()
            checked = compare(loss_and_grads(setup, shape, variant, checkpoint), ref, setup.dtype)
            _free()
            curve = loss_curve(setup, shape, variant, checkpoint)
            _free()
            if graphs:
                row = timed_graphed(setup, shape, variant, checkpoint, ref.loss)
            else:
                row = timed_eager(setup, shape, variant, checkpoint)
            _free()
            times = shared.setdefault(key, {})
            if is_baseline(variant):
                times[variant] = row["step_ms"]
            base = [t for v, t in times.items()]
            nan = float("nan")
            return {
                **row,
                "tokens_per_s": shape.tokens / (row["step_ms"] / 1e3),
                "speedup_vs_sdpa_cudnn": times["sdpa-cudnn"] / row["step_ms"]
                if "sdpa-cudnn" in times
                else nan,
                "speedup_vs_best_baseline": min(base) / row["step_ms"] if base else nan,
                "steps": setup.steps,
                "loss_ref": ref.loss,
                **checked,
                "loss_curve": ";".join(f"{x:.5g}" for x in curve),
                "loss_first": curve[0] if curve else nan,
                "loss_last": curve[-1] if curve else nan,
                "loss_lowered": loss_lowered(curve),
            }

        cols = {
            "base_variant": variant,
            "checkpoint": checkpoint,
            "graphs": graphs,
            "reference": REFERENCE,
            **columns,
        }
        return Cell(variant_label(variant, checkpoint, graphs), shape.name, setup.dtype, run, cols)

    return [cell(v, c, g) for c in checkpoints for g in graph_toggles for v in order]
