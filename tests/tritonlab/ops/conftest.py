"""tritonlab.ops tests: every ``torch.empty`` is poisoned, so an output element a kernel forgets to
write shows up as NaN instead of passing on stale memory."""

import pytest

from tritonlab.testing import poisoned_empty


@pytest.fixture(autouse=True)
def _poison_uninitialized_memory():
    with poisoned_empty():
        yield
