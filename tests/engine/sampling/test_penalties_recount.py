"""`recount` (moe/engine/sampling/penalties.py), the from-scratch count a rollback or a rebuild
falls back to: int32 like the running counts it replaces, and an empty history is all zeros."""

from __future__ import annotations

import torch

from moe.engine.sampling.penalties import recount


def test_recount_is_an_int32_histogram_and_empty_is_zeros():
    got = recount([3, 1, 3, 3], 5)
    assert got.dtype == torch.int32 and got.tolist() == [0, 1, 0, 3, 0]
    empty = recount([], 4)
    assert empty.dtype == torch.int32 and empty.tolist() == [0, 0, 0, 0]
