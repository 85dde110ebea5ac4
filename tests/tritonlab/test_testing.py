"""tritonlab.testing.rel_err: the float64 relative error every test and benchmark check uses."""

import math

import pytest
import torch

from tritonlab import testing
from tritonlab.testing import rel_err


def _naive(got, ref, scale=0.0):
    got, ref = got.double(), ref.double()
    return ((got - ref).norm() / max(ref.norm().item(), scale, 1e-300)).item()


@pytest.mark.parametrize("chunk", [1, 7, 1 << 24])
def test_rel_err_matches_the_whole_tensor_norm_across_chunk_boundaries(monkeypatch, chunk):
    monkeypatch.setattr(testing, "REL_ERR_CHUNK", chunk)
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(5, 13, generator=g)
    got = (ref + 1e-3 * torch.randn(5, 13, generator=g)).to(torch.bfloat16)
    assert rel_err(got, ref) == pytest.approx(_naive(got, ref), rel=1e-12)


def test_rel_err_takes_strided_views_and_mixed_dtypes():
    ref = torch.randn(6, 10, dtype=torch.float64)
    got = ref.float().t().contiguous().t()  # the same values in another layout
    assert rel_err(got[:, ::3], ref[:, ::3]) < 1e-7
    assert rel_err(got[:, ::3], ref[:, ::3]) == pytest.approx(_naive(got[:, ::3], ref[:, ::3]), rel=1e-12)


def test_rel_err_is_nan_when_any_element_is_nan():
    ref = torch.ones(100)
    got = ref.clone()
    got[57] = float("nan")
    assert math.isnan(rel_err(got, ref))
    got[57] = float("inf")
    assert rel_err(got, ref) == math.inf


def test_rel_err_scale_is_the_yardstick_for_a_cancelled_reference():
    ref = torch.zeros(4)
    got = torch.full((4,), 1e-3)
    assert rel_err(got, ref, scale=2.0) == pytest.approx(2e-3 / 2.0)
    assert rel_err(torch.empty(0), torch.empty(0)) == 0.0


def test_rel_err_refuses_tensors_of_different_sizes_rather_than_broadcasting():
    with pytest.raises(ValueError, match="got has 3 elements, ref has 9"):
        rel_err(torch.ones(3), torch.ones(3, 3))
