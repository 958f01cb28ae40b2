"""Fixtures shared by the CPU tests."""

import os

import pytest
import torch

# Ray (tests/test_ray_executor.py) binds to loopback only when this is set before it is imported:
# a test cluster must never listen on, or connect to, this machine's network address.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: on a shared 2-core machine, intra-op threads only spin against each other (up to 60× slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
