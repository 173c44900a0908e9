import os

import pytest
import torch
from threadpoolctl import threadpool_limits


@pytest.fixture(scope="module")
def one_thread():
    """Run a module's tests with one torch and one BLAS thread (small tensors: threads only add overhead)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(1):
        yield
    torch.set_num_threads(n)


def pytest_configure(config):
    """Under pytest-xdist each worker is one process of the suite: one torch / BLAS thread per worker,
    so two workers on two cores do not oversubscribe them."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
        threadpool_limits(1)


def pytest_collection_modifyitems(session, config, items):
    """The slow tests first (stable order otherwise): spread over workers, they then run beside the
    many short ones instead of finishing last."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
