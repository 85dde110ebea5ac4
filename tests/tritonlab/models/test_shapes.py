"""tritonlab.models.shapes: the spec's shapes, and overrides checked before any work."""

import pytest

from tritonlab.models import SHAPES, resolve_shape


def test_bad_shape_arguments_are_rejected_early():
    with pytest.raises(ValueError, match="shape"):
        resolve_shape("huge")
    with pytest.raises(ValueError, match="batch"):
        resolve_shape("small", batch=0)
    with pytest.raises(ValueError, match="M"):
        resolve_shape("small", m_context=0)
    with pytest.raises(ValueError, match="N"):
        resolve_shape("small", n_target=0)


def test_the_spec_shapes():
    assert resolve_shape("mid").tokens == 4 * 11_000
    assert (SHAPES["large"].m_context, SHAPES["large"].n_target, SHAPES["large"].batch) == (200_000, 5_000, 1)
    assert resolve_shape("small", batch=3).batch == 3
