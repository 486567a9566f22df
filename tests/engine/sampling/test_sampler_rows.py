"""`row_argmax` and `finite_rows` (moe/engine/sampling/sampler.py) against the plain torch calls
they stand for: the same indices (first of ties, infinities, NaNs) and the same verdicts, including
the rows a row sum alone would misjudge (finite values whose sum overflows)."""

import pytest
import torch

from moe.engine.sampling.sampler import finite_rows, row_argmax


def _awkward_rows(V: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(V)
    x = torch.randint(0, 3, (12, V), generator=g).to(dtype)  # many ties
    x[1] = 2.0  # one value everywhere: the first index
    x[2] = -float("inf")
    x[3, V // 2] = float("inf")
    x[4, V - 1] = float("nan")
    x[5, 0], x[5, V - 1] = float("nan"), float("inf")
    x[6, :] = torch.finfo(dtype).max  # finite, but the row sum overflows
    x[7, V // 3] = -float("inf")
    x[8, 1:] = float("inf") if V > 1 else x[8, 1:]
    x[9] = -torch.finfo(dtype).max
    return x


@pytest.mark.parametrize("V", [1, 2, 7, 64, 4097])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_row_argmax_is_argmax(V, dtype):
    x = _awkward_rows(V, dtype)
    assert row_argmax(x).tolist() == x.argmax(dim=-1).tolist()
    assert row_argmax(x[:0]).shape == (0,)


@pytest.mark.parametrize("V", [1, 3, 4096])
def test_finite_rows_is_isfinite_all(V):
    x = _awkward_rows(V)
    assert finite_rows(x) == torch.isfinite(x).all(dim=-1).tolist()
    ok = torch.randn(5, V)
    assert finite_rows(ok) == [True] * 5  # the one-sum path
    assert finite_rows(ok[:0]) == []


def test_finite_rows_overflowing_sum_is_finite():
    x = torch.full((3, 4096), 3e37)  # each value finite, each row's sum inf
    x[1, 7] = float("nan")
    assert finite_rows(x) == [True, False, True]
