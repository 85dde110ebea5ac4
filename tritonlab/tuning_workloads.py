"""The shapes the config tables are tuned at, and how to run each autotuned kernel there.

A :class:`Workload` is one public function at one shape and dtype: running it once (forward, and
backward where the backward has an autotuned kernel) makes every registered kernel on its path meet
its autotuning key. Phase 11 runs each workload under ``TRITONLAB_AUTOTUNE=full`` on a GPU and
writes what ``tritonlab.tuning_tables.TUNER`` timed into the tables; its sm_80 compile check runs
the same workloads with every launch intercepted, to compile each config for that target.

The shapes: the TransformerNP's small, mid and large (as the model calls each kernel: attention
over B·8 heads of D = 64 with M + N queries and M keys, the MLP over B·(M+N) tokens, the heads over
B·N targets), which are also the benchmark shapes of phases 02-07 and 12; and the attention phases'
sweep over key lengths (``SWEEP_SHAPES``, attention only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .models.shapes import SHAPES, TNPShape
from .models.tnp import TNPConfig

TNP_SHAPES = ("small", "mid", "large")
MODEL = TNPConfig()
# Phases 02-04's attention sweep over key lengths (``--sweep-lk``): Lq = 1.1 Lk, B·H·Lq kept near the
# large shape's 8 × 220 000 query rows so every point fills the GPU.
SWEEP_LK = (1_000, 3_000, 10_000, 30_000, 100_000, 200_000)
SWEEP_QUERY_ROWS = 8 * 220_000


def sweep_shape(lk: int, query_rows: int = SWEEP_QUERY_ROWS) -> TNPShape:
    """A sweep point as a TNP shape: M = Lk context points, N = Lq - Lk targets, B batches of 8 heads."""
    lq = round(1.1 * lk)
    return TNPShape(f"sweep-Lk{lk}", lk, lq - lk, max(1, round(query_rows / (MODEL.n_heads * lq))))


SWEEP_SHAPES = {shape.name: shape for shape in map(sweep_shape, SWEEP_LK)}
# FlashAttention-2 (3-D, heads folded into the batch, causal bf16): (B, N, D) where its code table's
# tiles were measured (``tritonlab.attention.flash2``), N queries and keys.
FLASH2_SHAPES = ((16, 16_384, 64), (8, 8_192, 128))
# The sweep measures attention alone.
SWEEP_FUNCTIONS = ("attention", "fused_attention")


@dataclass(frozen=True)
class Workload:
    """``function`` at ``shape`` in ``dtype``; ``kernels``: the registered kernels it tunes."""

    function: str
    shape: str
    dtype: torch.dtype
    kernels: tuple[str, ...]
    build: Callable[[TNPShape, torch.dtype, torch.device, bool], Callable[[], tuple]]

    @property
    def name(self) -> str:
        return f"{self.function}@{self.shape}"

    def runner(self, device: torch.device | str = "cuda", random: bool = True) -> Callable[[], tuple]:
        """A call that runs the workload once on inputs built now (kept by the call) and returns its
        output and input gradients (the MLP: its output); the inputs are random, or
        uninitialised where only their layouts matter (the sm_80 compile check: random fill of the
        large shape costs seconds on the CPU)."""
        shape = SWEEP_SHAPES.get(self.shape) or SHAPES[self.shape]
        return self.build(shape, self.dtype, torch.device(device), random)


def _tensor(shape, dtype, device, random: bool, requires_grad=False) -> torch.Tensor:
    make = torch.randn if random else torch.empty
    return make(shape, dtype=dtype, device=device).requires_grad_(requires_grad)


def _forward_backward(forward: Callable[[], torch.Tensor], leaves: tuple, grad_out: torch.Tensor):
    """A run: ``forward()`` then its backward from ``grad_out``; the output and the leaves' gradients
    (cleared first, so each run's are its own)."""

    def run():
        for t in leaves:
            t.grad = None
        out = forward()
        out.backward(grad_out)
        return (out.detach(), *(t.grad for t in leaves))

    return run


def _attention(function: str):
    """``tritonlab.attention.<function>`` (q, k, v) -> o, forward and backward."""

    def build(shape: TNPShape, dtype, device, random):
        from . import attention

        fn = getattr(attention, function)
        B, H, D = shape.batch, MODEL.n_heads, MODEL.head_dim
        L, M = shape.m_context + shape.n_target, shape.m_context
        # The model's layout: q, k, v are views of (B, L, H·D) projections.
        q = _tensor((B, L, H, D), dtype, device, random, True)
        kv = _tensor((B, M, 2, H, D), dtype, device, random)
        k = kv[:, :, 0].transpose(1, 2).detach().requires_grad_()
        v = kv[:, :, 1].transpose(1, 2).detach().requires_grad_()
        q_view = q.transpose(1, 2)
        do = _tensor((B, H, L, D), dtype, device, random)
        return _forward_backward(lambda: fn(q_view, k, v), (q, k, v), do)

    return build


def _mlp(function: str):
    def build(shape: TNPShape, dtype, device, random):
        from . import mlp

        fn = getattr(mlp, function)
        x = _tensor((shape.tokens, MODEL.d_model), dtype, device, random)
        w1 = _tensor((MODEL.d_ff, MODEL.d_model), dtype, device, random)
        w2 = _tensor((MODEL.d_model, MODEL.d_ff), dtype, device, random)
        # Forward only: the MLP's backward is cuBLAS and one elementwise kernel, none autotuned.
        return lambda: (fn(x, w1, w2),)

    return build


def _heads(shape: TNPShape, dtype, device, random):
    from .grouped_gemm import gmm_heads

    T, G = shape.batch * shape.n_target, MODEL.n_components
    z = _tensor((T, MODEL.d_model), dtype, device, random, True)
    w1 = _tensor((G, MODEL.d_head_hidden, MODEL.d_model), dtype, device, random, True)
    w2 = _tensor((G, 3, MODEL.d_head_hidden), dtype, device, random, True)
    dout = _tensor((T, G, 3), dtype, device, random)
    return _forward_backward(lambda: gmm_heads(z, w1, w2), (z, w1, w2), dout)


# Per public function: the kernels it tunes and how to run it.
FUNCTIONS: dict[str, tuple[tuple[str, ...], Callable]] = {
    "attention": (("attention.forward", "attention.dkdv", "attention.dq"), _attention("attention")),
    "fused_attention": (("attention.forward", "attention.fused_backward"), _attention("fused_attention")),
    # Phase 05: the FP8 forward (its table is the fp8 one), then the bf16 two-pass backward.
    "fp8_attention": (
        ("attention.fp8_forward", "attention.dkdv", "attention.dq"),
        _attention("fp8_attention"),
    ),
    "fused_mlp": (("mlp.staged_forward",), _mlp("fused_mlp")),
    "fused_mlp_in_registers": (("mlp.register_forward",), _mlp("fused_mlp_in_registers")),
    "gemm_silu_mlp": (("mlp.gemm_silu",), _mlp("gemm_silu_mlp")),
    "gmm_heads": (("heads.forward", "heads.hidden_backward"), _heads),
}


def workloads(shapes=TNP_SHAPES, dtypes=(torch.bfloat16,), functions=tuple(FUNCTIONS)) -> list[Workload]:
    """Every function at every shape and dtype (the tables' bf16 by default), in that order; the
    sweep's shapes (``SWEEP_SHAPES``) only for the attention functions."""
    unknown = [f for f in functions if f not in FUNCTIONS]
    if unknown:
        raise ValueError(f"functions: unknown {unknown}; expected some of {', '.join(FUNCTIONS)}")
    bad = [s for s in shapes if s not in SHAPES and s not in SWEEP_SHAPES]
    if bad:
        raise ValueError(f"shapes: unknown {bad}; expected some of {', '.join([*SHAPES, *SWEEP_SHAPES])}")
    return [
        Workload(fn, shape, dtype, *FUNCTIONS[fn])
        for dtype in dtypes
        for shape in shapes
        for fn in functions
        if shape not in SWEEP_SHAPES or fn in SWEEP_FUNCTIONS
    ]


def import_kernels() -> None:
    """Import every module that registers an autotuned kernel, so the registry is complete."""
    from . import attention, grouped_gemm, mlp, sparse_ffn  # noqa: F401


def stale_entries(table_dir=None) -> list[tuple[str, str, str]]:
    """(file, kernel, key) of every table entry whose config is not in its kernel's search space
    (FlashAttention-2's: not among its ``TUNE_CANDIDATES``); at launch such an entry is ignored with
    a warning and the kernel tunes. The search spaces are the GPU's: under Triton's interpreter the
    kernels are built with smaller ones, so call this in a process without ``TRITON_INTERPRET``."""
    from .attention import flash2
    from .tuning_tables import TABLE_DIR, TUNER, ConfigTable, config_id

    import_kernels()
    stale = []
    for path in sorted((table_dir or TABLE_DIR).glob("*_*.json")):
        if path.stem == "sm80_compile":  # the compile results behind the A100 table, not a table
            continue
        for name, entries in ConfigTable.load(path).entries.items():
            for key, entry in entries.items():
                if name.startswith("flash2."):
                    candidates = flash2.TUNE_CANDIDATES[name.removeprefix("flash2.")]
                    known = flash2.tiles_from_entry(entry["config"]) in candidates
                else:
                    kernel = TUNER.kernels.get(name)
                    known = kernel is not None and kernel.config_named(config_id(entry["config"])) is not None
                if not known:
                    stale.append((path.name, name, key))
    return stale
