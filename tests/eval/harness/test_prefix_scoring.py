"""Prefix-shared scoring equals one forward per request (`eval.loglik.reference_loglikelihood`),
whatever the batching, truncation or prefix grouping; and shared prefixes do run once."""

from __future__ import annotations

import random

import pytest
import torch

from eval.harness.prefix_scoring import score_requests, split_request
from eval.loglik import reference_loglikelihood
from moe.model import Transformer
from tests.conftest import tiny_model_config


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Transformer(tiny_model_config(max_seq_len=64)).eval()


def _requests(seed: int, vocab: int) -> list:
    rng = random.Random(seed)
    reqs = []
    for _ in range(5):  # questions: one context, several choices
        ctx = [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))]
        reqs += [(ctx, [rng.randrange(vocab) for _ in range(rng.randrange(1, 6))]) for _ in range(4)]
    reqs.append(([3], [rng.randrange(vocab) for _ in range(40)]))  # a rolling window: nothing to share
    reqs.append(([rng.randrange(vocab) for _ in range(60)], [1, 2, 3]))  # left-truncated to max_length
    return reqs + reqs[:2]  # duplicates score once


@pytest.mark.parametrize("batch_size", [1, 3, 64])
def test_scores_equal_one_forward_per_request(model, batch_size):
    reqs = _requests(0, model.cfg.vocab_size)
    results, stats = score_requests(model, reqs, max_length=48, batch_size=batch_size)
    for (ctx, cont), (ll, greedy) in zip(reqs, results):
        assert ll == pytest.approx(reference_loglikelihood(model, ctx, cont, 48), abs=1e-4)
        assert isinstance(greedy, bool)
    assert stats["unique_requests"] == len(reqs) - 2
    assert stats["prefix_groups"] <= 7  # 5 questions, the truncated request, the rolling window
    if batch_size >= 4:  # a question's four choices run their context once: 3 of each 4 context runs saved
        assert stats["prefix_tokens"] < stats["prefix_tokens_unshared"] - 2 * 3 * 5
    else:  # a group cut into pieces runs its prefix once per piece
        assert stats["forwards"] >= 2 * -(-stats["unique_requests"] // batch_size)


def test_greedy_flag_is_true_for_the_argmax_continuation(model):
    ctx = [5, 6, 7]
    logits = model(torch.tensor([ctx])).logits[0, -1]
    best = int(logits.argmax())
    (_, greedy), = score_requests(model, [(ctx, [best])], max_length=48)[0]
    (_, not_greedy), = score_requests(model, [(ctx, [(best + 1) % model.cfg.vocab_size])], max_length=48)[0]
    assert greedy and not not_greedy


def test_split_request_is_the_harness_window():
    s = split_request([1, 2, 3, 4], [5, 6], max_length=4)
    assert (s.prefix, s.suffix) == ((2, 3), (4, 5))  # window (1..6)[-5:][:-1] = 2 3 4 5
    with pytest.raises(ValueError, match="non-empty context"):
        split_request([], [1], 8)
