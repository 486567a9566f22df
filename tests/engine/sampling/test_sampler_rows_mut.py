"""Added by the seventh mutation run (docs/results/mutation/run7_mutP/): `row_argmax`'s choice of op
by device (the CPU's `max(dim=-1)`, `argmax` elsewhere), checked off the CPU on the meta device
(no data: the shapes and the op called), which the first-pass tests (all on the CPU) do not reach."""

import pytest
import torch
from torch.overrides import TorchFunctionMode

from moe.engine.sampling.sampler import finite_rows, row_argmax


class _Ops(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_row_argmax_takes_max_on_the_cpu_and_argmax_elsewhere():
    for device, op in (("cpu", "max"), ("meta", "argmax")):
        x = torch.zeros(3, 5, device=device)
        with _Ops() as seen:
            idx = row_argmax(x)
        assert op in seen.names and ({"max", "argmax"} - {op}).isdisjoint(seen.names), (device, seen.names)
        assert idx.shape == (3,) and idx.dtype == torch.int64 and idx.device.type == device  # one index a row


def test_finite_rows_settles_an_all_finite_step_by_one_sum():
    """All-finite logits: one sum of the whole step settles it (no element-wise `isfinite` pass over the
    [B, V] logits, the cost the function exists to avoid); a non-finite row: the element-wise check."""
    from moe.engine.sampling.sampler import finite_rows

    class _Finite(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.shapes, self.sums = [], []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.isfinite:
                self.shapes.append(tuple(args[0].shape))
            if func is torch.Tensor.sum:
                self.sums.append((tuple(args[0].shape), args[1:], kwargs))
            return func(*args, **(kwargs or {}))

    x = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    with _Finite() as seen:
        assert finite_rows(x) == [True] * 4
    assert (4, 50) not in seen.shapes and seen.sums == [((4, 50), (), None)], (seen.shapes, seen.sums)
    x[2, 7] = float("inf")
    with _Finite() as seen:
        assert finite_rows(x) == [True, True, False, True]
    assert (4, 50) in seen.shapes


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "+inf", "-inf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_finite_rows_finds_each_kind_of_non_finite_value_alone(bad, dtype):
    """A step whose only non-finite value is one NaN, one +inf or one -inf (no other to push the whole-step
    sum off the finite line, no overflow): the one sum must still send it to the element-wise check, and
    the verdict is `isfinite(x).all(-1)`'s. (A check of the sum that lets a NaN or a -inf through, such as
    `sum < inf` or a NaN-ignoring sum, passes every step that also holds a +inf.) Also a whole row of
    -inf (a fully masked row) beside finite ones."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 33, generator=g).to(dtype)
    x[3, 17] = bad
    want = torch.isfinite(x).all(dim=-1).tolist()
    assert want == [True, True, True, False, True]
    assert finite_rows(x) == want
    masked = torch.randn(3, 33, generator=g).to(dtype)
    masked[1] = -float("inf")
    assert finite_rows(masked) == torch.isfinite(masked).all(dim=-1).tolist() == [True, False, True]
