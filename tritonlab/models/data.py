"""Synthetic 1-D regression tasks, drawn on the device.

Each task is a random function from random Fourier features -- a sample, approximately, of a
Gaussian process with an RBF kernel of a random length-scale -- observed with noise at random
inputs. Drawing 200 000 points costs one small matmul, so data never limits a benchmark.
"""

import math
from typing import NamedTuple

import torch
from torch import Tensor


class Tasks(NamedTuple):
    xc: Tensor  # (B, M, x_dim) context inputs
    yc: Tensor  # (B, M, 1)     context outputs
    xt: Tensor  # (B, N, x_dim) target inputs
    yt: Tensor  # (B, N, 1)     target outputs, what the model predicts


def sample_tasks(
    batch: int,
    m_context: int,
    n_target: int,
    *,
    x_dim: int = 1,
    device="cpu",
    generator: torch.Generator | None = None,
    n_features: int = 128,
    noise_std: float = 0.05,
) -> Tasks:
    """``batch`` tasks of M context and N target points; reproducible through ``generator``."""
    kw = {"device": device, "generator": generator}
    length = m_context + n_target
    x = torch.rand(batch, length, x_dim, **kw) * 4 - 2
    lengthscale = torch.rand(batch, 1, 1, **kw) * 0.9 + 0.1
    freqs = torch.randn(batch, n_features, x_dim, **kw) / lengthscale
    phases = torch.rand(batch, 1, n_features, **kw) * 2 * math.pi
    amplitudes = torch.randn(batch, n_features, 1, **kw)
    f = torch.cos(x @ freqs.transpose(1, 2) + phases) @ amplitudes * math.sqrt(2 / n_features)
    y = f + noise_std * torch.randn(f.shape, **kw)
    return Tasks(x[:, :m_context], y[:, :m_context], x[:, m_context:], y[:, m_context:])
