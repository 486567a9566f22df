"""Offloaded engines give the fully resident engine's greedy tokens and log-probabilities,
bit for bit, for every policy and budget (top_k experts per layer: nearly every use a miss;
a middle one; all experts), with continuous batching over mixed prompts, prefix caching and
speculative decoding. The tiny model routes top-2 of 4 experts over 2 layers."""

from __future__ import annotations

import pytest

from tests.engine.conftest import build_model
from tests.engine.offload.engines import POLICIES, engine, mixed_prompts, run

BUDGETS = (2, 3, 4)  # top_k, middle, all of the 4 experts


@pytest.fixture(scope="module")
def model():
    return build_model(260, seed=7)


@pytest.fixture(scope="module")
def prompts():
    return mixed_prompts()


@pytest.fixture(scope="module")
def resident(model, prompts):
    return run(engine(model), prompts)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_budget_matches_resident(model, prompts, resident, policy):
    for budget in BUDGETS:
        llm = engine(model, expert_cache={"experts_per_layer": budget, "policy": policy})
        assert run(llm, prompts) == resident, (policy, budget)
        stats = llm.stats()
        assert stats["offload/uses"] > 0 and stats["offload/experts_per_layer"] == budget
        if policy == "ondemand":
            assert stats["offload/hits"] == 0  # the naive baseline keeps nothing
        if budget < 4 and policy != "lookahead":
            assert stats["offload/misses"] > 4 * 2  # more than the first fill: evictions happened
        if policy == "lookahead":
            assert stats["offload/prefetch_precision"] > 0 and 0 < stats["offload/prefetch_recall"] <= 1


def test_prefix_cache_rerun_matches_resident(model, prompts):
    # a rerun prefills from cached blocks (other attention chunks than a cold run), so the
    # reference is the resident engine's own rerun
    resident, offloaded = engine(model), engine(model, expert_cache={"experts_per_layer": 2, "policy": "lookahead"})
    assert run(offloaded, prompts) == run(resident, prompts)
    assert run(offloaded, prompts) == run(resident, prompts)
    assert offloaded.stats()["prefix_cache_hits"] > 0


@pytest.mark.parametrize("method", ["ngram", {"method": "self", "top_k": 1}])
def test_speculative_matches_resident(model, prompts, method):
    # verifying k proposed tokens in one forward rounds differently than decoding one by one,
    # so the reference is the resident engine with the same speculation
    llm = engine(model, speculative=method, expert_cache={"experts_per_layer": 2, "policy": "lookahead"})
    assert run(llm, prompts) == run(engine(model, speculative=method), prompts)
    assert llm.stats()["offload/misses"] > 0


def test_top_4_routing_chunked_matches_resident(prompts):
    # 4 experts per token, 4 slots of 8: prefills need all 8, so every layer runs in chunks
    wide = build_model(260, seed=3, n_experts=8)
    wide.set_routing(top_k=4)
    llm = engine(wide, expert_cache={"experts_per_layer": 4, "policy": "lru"})
    assert run(llm, prompts) == run(engine(wide), prompts)
    assert llm.stats()["offload/misses"] > 8 * 2
