"""The server tests run a tiny model in a thread of the test process; the fixtures are in
tests/serve_fixtures.py (shared with tests/benchmarks/serving)."""

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """Tiny model, loaded machine: intra-op threads only add overhead (server and client run here)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
