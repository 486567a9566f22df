"""The HF tests run single-threaded (`_one_thread`); their models come from tests/hf_fixtures.py."""

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs single-threaded (tests/conftest.py's `one_thread`: tiny models)."""
