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
