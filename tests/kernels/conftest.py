import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny tensors: torch threads only add overhead (and the interpreter is Python anyway)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
