"""`target_probs` (moe/engine/speculative/rejection.py) for top-p, min-p and their combinations,
against distributions worked out by hand: speculative verification must accept against exactly
the distribution the sampler draws from (test_rejection.py covers the penalty and top-k)."""

from __future__ import annotations

import pytest
import torch

from moe.engine import SamplingParams
from moe.engine.speculative.rejection import target_probs

LOGITS = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.0, 3.0, 1.0, 2.0]])


def kept(row: list[int], keep: list[set], temperature: float = 1.0) -> torch.Tensor:
    """softmax(logits / T) renormalised over the kept tokens of each row."""
    out = torch.softmax(LOGITS / temperature, dim=-1)
    mask = torch.tensor([[t in keep[r] for t in range(4)] for r in row])
    out = out * mask
    return out / out.sum(dim=-1, keepdim=True)


@pytest.mark.parametrize("params, keep", [
    # softmax row 0 = [.61, .22, .14, .03]: top-p 0.7 keeps the tokens until 0.7 is reached
    (dict(top_p=0.7), [{0, 1}, {1, 3}]),
    # min-p 0.2: tokens with at least 0.2 x the most likely one's probability
    (dict(min_p=0.2), [{0, 1, 2}, {1, 3}]),
    (dict(top_k=3, top_p=0.99), [{0, 1, 2}, {1, 2, 3}]),
    (dict(top_p=1.0, min_p=0.0), [{0, 1, 2, 3}, {0, 1, 2, 3}]),
])
def test_target_probs_apply_top_p_and_min_p_per_row(params, keep):
    got = target_probs(LOGITS, SamplingParams(temperature=1.0, **params), [[], []])
    assert torch.allclose(got, kept([0, 1], keep), atol=1e-6), got


def test_temperature_scales_before_the_filters():
    # T = 0.5 sharpens row 0 to [.84, .11, .04, .00]: top-p 0.9 keeps {0, 1} (at T = 1 it would keep 3 tokens)
    got = target_probs(LOGITS, SamplingParams(temperature=0.5, top_p=0.9), [[], []])
    assert torch.allclose(got[0], kept([0], [{0, 1}], temperature=0.5)[0], atol=1e-6), got


def test_greedy_is_one_hot_on_the_penalised_argmax_of_each_row():
    got = target_probs(LOGITS, SamplingParams(temperature=0, repetition_penalty=4.0), [[0], [1, 3]])
    # row 0: 2.0 / 4 = 0.5 ties token 2 and loses to token 1; row 1: 3 -> 0.75, 2 -> 0.5: token 2 (1.0) wins
    assert torch.equal(got, torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]))
