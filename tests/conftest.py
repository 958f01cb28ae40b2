"""Fixtures shared by the CPU tests."""

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: on a shared 2-core machine, intra-op threads only spin against each other (up to 60× slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
