"""The HF tests run single-threaded (see `_one_thread`); their models come from tests/hf_fixtures.py."""

import pytest
import torch

@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models: intra-op threads only add sync overhead (and spin badly on shared cores)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
