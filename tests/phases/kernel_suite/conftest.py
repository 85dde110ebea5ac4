"""Kernel-suite test set-up: every ``torch.empty`` is poisoned, so an output element the kernel forgets to
write shows up as NaN instead of passing on stale memory."""

import pytest
import torch


@pytest.fixture(autouse=True)
def poison_uninitialized_memory():
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    # With deterministic algorithms on, torch fills new float tensors with NaN (integers with their max).
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(previous[0])
    torch.utils.deterministic.fill_uninitialized_memory = previous[1]


def _rel_err(got: torch.Tensor, ref: torch.Tensor, scale: float = 0.0) -> float:
    """||got - ref|| / max(||ref||, scale) in float64 (NaN anywhere gives NaN, which fails every bound).

    ``scale`` is for results that cancel to almost nothing (RMSNorm's dx at width 1): the size of the
    terms that cancelled is then the yardstick for rounding error, not the tiny remainder."""
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    return ((got - ref).norm() / max(ref.norm().item(), scale, 1e-300)).item()


@pytest.fixture
def rel_err():
    return _rel_err
