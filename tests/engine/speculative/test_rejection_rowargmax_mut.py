"""Added by the eighth mutation run of the decode step (docs/results/mutation/run8_decode/): `target_probs`
(moe/engine/speculative/rejection.py) as 05bc881 left it (the greedy one-hot from the sampler's `row_argmax`),
each test written against mutants of the function the first-pass tests let live, or pinning the switch."""

import pytest
import torch

import moe.engine.speculative.rejection as rejection
from moe.engine import SamplingParams
from moe.engine.speculative.rejection import target_probs


@pytest.mark.parametrize("params", [dict(temperature=0.7), dict(temperature=1.3, top_p=1.0, min_p=0.0)])
def test_no_filter_call_when_no_filter_is_set(monkeypatch, params):
    """top-k off, top-p 1 and min-p 0 mask nothing: the filter (a sort of every row over the
    vocabulary) is not called at all, and the rows are softmax(logits / T)."""
    calls = []

    def spy(*a):
        calls.append(a)
        raise AssertionError("the filter was called with no filter set")

    monkeypatch.setattr(rejection, "top_k_top_p_min_p_mask", spy)
    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(0))
    got = target_probs(logits, SamplingParams(**params), [[]] * 3)
    assert calls == []
    torch.testing.assert_close(got, torch.softmax(logits / params["temperature"], dim=-1), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_greedy_one_hot_is_argmax_for_ties_infinities_and_nans(dtype):
    """row_argmax gives argmax's index: the first of tied maxima, the first NaN of a row with NaNs; the
    one-hot is fp32 (the logits are read as fp32) whatever the logits' dtype."""
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0],              # a tie: the first
                           [float("-inf"), -2.0, float("inf"), float("inf")],
                           [0.0, float("nan"), 5.0, float("nan")],   # NaN: the first NaN, as argmax
                           [-1.0, -1.0, -1.0, -1.0]], dtype=dtype)
    got = target_probs(logits, SamplingParams(temperature=0), [[]] * 4)
    assert got.dtype == torch.float32
    want = torch.zeros(4, 4)
    want[torch.arange(4), logits.float().argmax(dim=-1)] = 1.0
    assert torch.equal(got, want)
    assert logits.float().argmax(dim=-1).tolist() == [1, 2, 1, 0]


def test_filter_arguments_are_fp32_whatever_the_default_dtype(monkeypatch):
    """top-p and min-p go to the sampler's filter as fp32 tensors (as the sampler builds them), also where
    torch's default dtype is not fp32: a dropped `dtype=` would follow the default (fp64 here)."""
    seen = []

    def spy(scaled, top_k, top_p, min_p):
        seen.append((top_p.dtype, min_p.dtype, top_p.tolist(), min_p.tolist()))
        return scaled

    monkeypatch.setattr(rejection, "top_k_top_p_min_p_mask", spy)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        target_probs(torch.randn(2, 5, dtype=torch.float32), SamplingParams(temperature=1.0, top_p=0.5, min_p=0.25),
                     [[]] * 2)
    finally:
        torch.set_default_dtype(old)
    assert seen == [(torch.float32, torch.float32, [0.5, 0.5], [0.25, 0.25])]
