from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.register_assert_rewrite("tests.train.runs")  # its comparison helpers explain their failures

from moe.train import train  # noqa: E402
from tests.train.runs import composed_cfg  # noqa: E402


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """The uninterrupted run every resume and fault test must reproduce (also builds the data cache)."""
    tmp = tmp_path_factory.mktemp("reference")
    ref = SimpleNamespace(cache=tmp / "cache", run=tmp / "run")
    train(composed_cfg(ref.cache), ref.run)
    return ref
