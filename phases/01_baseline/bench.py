"""Phase 01's cells: one training step of the TransformerNP per shape, mode and SDPA backend, and
the loss curve of a short training run."""

from collections.abc import Iterator

from common import Cell, ResultWriter
from common.step import measure_training_step
from tritonlab.models import Components, TNPConfig, TNPShape, sdpa_attention, train_loss_curve

MODES = ("eager", "compile")


def step_cells(
    cfg: TNPConfig,
    shapes: list[TNPShape],
    modes: list[str],
    backends: list[str],
    dtype_name: str,
    *,
    steps: int | None = None,
    warmup: int = 2,
) -> Iterator[Cell]:
    """One cell per shape, mode and backend: forward, backward and AdamW, with per-stage times,
    tokens/s and peak memory (``common.step.measure_training_step``). The large shape runs 3 timed
    steps after at most one warm-up step unless ``steps`` says otherwise: each takes seconds."""
    for shape in shapes:
        n_steps = steps or (3 if shape.name == "large" else 10)
        n_warmup = min(warmup, 1) if shape.name == "large" else warmup
        for mode in modes:
            for backend in backends:

                def run(shape=shape, mode=mode, backend=backend, n_steps=n_steps, n_warmup=n_warmup):
                    result = measure_training_step(
                        cfg,
                        Components(attention=sdpa_attention(backend)),
                        shape,
                        dtype_name,
                        compile_model=mode == "compile",
                        warmup=n_warmup,
                        steps=n_steps,
                    )
                    return result.as_row()

                columns = {
                    "mode": mode,
                    "sdpa_backend": backend,
                    "m_context": shape.m_context,
                    "n_target": shape.n_target,
                    "batch": shape.batch,
                    "tokens": shape.tokens,
                }
                yield Cell(f"{mode}+sdpa-{backend}", shape.name, dtype_name, run, columns)


def train(
    writer: ResultWriter, cfg: TNPConfig, shape: TNPShape, backend: str, dtype_name: str, steps: int
) -> list[dict]:
    """Train ``steps`` steps on fresh tasks and write the loss every ``steps // 30`` steps as a row."""
    print(f"training {steps} steps at {shape.label()} with sdpa-{backend}")
    rows = []
    curve = train_loss_curve(
        cfg,
        Components(attention=sdpa_attention(backend)),
        shape,
        dtype_name,
        steps=steps,
        log_every=max(steps // 30, 1),
    )
    for step, loss in curve:
        rows.append(
            writer.write(
                {
                    "variant": f"train+sdpa-{backend}",
                    "shape": shape.name,
                    "dtype": dtype_name,
                    "m_context": shape.m_context,
                    "n_target": shape.n_target,
                    "batch": shape.batch,
                    "step": step,
                    "train_loss": loss,
                }
            )
        )
        print(f"  step {step:5d}  loss {loss:.4f}")
    return rows
