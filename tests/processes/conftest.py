"""Fixtures of the tests of what shmvec does in your process."""

from __future__ import annotations

import pytest


@pytest.fixture
def two_torch_threads():
    """torch on 2 intra-op threads during the test (the count a 2-core machine defaults to)."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)
