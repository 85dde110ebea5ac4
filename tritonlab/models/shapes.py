"""The TransformerNP shapes every phase measures: M context points, N targets, batch B."""

from dataclasses import dataclass


@dataclass(frozen=True)
class TNPShape:
    name: str
    m_context: int
    n_target: int
    batch: int

    @property
    def tokens(self) -> int:
        """Tokens per step: every context and target point of every task in the batch."""
        return self.batch * (self.m_context + self.n_target)

    def label(self) -> str:
        return f"{self.name} (M={self.m_context}, N={self.n_target}, B={self.batch})"


SHAPES: dict[str, TNPShape] = {
    "small": TNPShape("small", 64, 500, 64),
    "mid": TNPShape("mid", 10_000, 1_000, 4),
    "large": TNPShape("large", 200_000, 5_000, 1),
    # What a machine without a GPU runs: big enough to cross a block boundary, small enough
    # for Triton's interpreter. Not one of the spec's shapes.
    "tiny": TNPShape("tiny", 37, 11, 2),
}


def resolve_shape(
    name: str, batch: int | None = None, m_context: int | None = None, n_target: int | None = None
) -> TNPShape:
    """The named shape, with any overrides, after checking every field."""
    if name not in SHAPES:
        raise ValueError(f"shape: unknown shape {name!r}; expected one of {', '.join(SHAPES)}")
    base = SHAPES[name]
    shape = TNPShape(
        name,
        base.m_context if m_context is None else m_context,
        base.n_target if n_target is None else n_target,
        base.batch if batch is None else batch,
    )
    if shape.batch <= 0:
        raise ValueError(f"batch: must be a positive integer, got {shape.batch}")
    if shape.m_context < 1:
        raise ValueError(f"m_context (M): must be >= 1, got {shape.m_context}")
    if shape.n_target < 1:
        raise ValueError(f"n_target (N): must be >= 1, got {shape.n_target}")
    return shape
