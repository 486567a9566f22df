"""Quantized experts (int4, int8, fp8, mxfp4) in the expert cache in their stored form: the slow
tier and the slots hold the quantized module's own codes, scales and zero points (never a
dequantised copy), a load moves those stored bytes, `memory=` budgets count them, and the greedy
tokens and log-probabilities equal the resident quantized engine's for every policy, at a budget
of top_k experts per layer (every token a miss on some expert) and above it, and chunked."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn

from moe.engine import LLM
from moe.engine.offload.stored import check_experts, on_rows, template
from moe.errors import ConfigError
from moe.quant.modules import QuantExperts
from tests.engine.conftest import build_model
from tests.engine.offload.engines import ENGINE, POLICIES, engine, mixed_prompts, run

SCHEMES = {"int4": {"scheme": "int4", "group_size": 32}, "int8": "int8", "fp8": "fp8", "mxfp4": "mxfp4"}


@pytest.fixture(scope="module")
def prompts():
    return mixed_prompts()


@pytest.fixture(scope="module")
def quantized(prompts):
    """scheme -> (the quantized tiny model, the resident quantized engine's outputs); built on first use."""
    base, made = build_model(260, seed=7), {}

    def get(scheme):
        if scheme not in made:
            q = LLM.from_model(copy.deepcopy(base), quantization=SCHEMES[scheme], **ENGINE).model
            made[scheme] = (q, run(engine(q), prompts))
        return made[scheme]
    return get


def stored_bytes(q) -> tuple[QuantExperts, int]:
    experts = q.layers[0].ffn.experts
    assert isinstance(experts, QuantExperts)
    return experts, experts.quantized_bytes() // experts.n_experts


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("policy", POLICIES)
def test_quantized_matches_resident_quantized(quantized, prompts, scheme, policy):
    q, resident = quantized(scheme)
    for budget in (2, 3) if policy == "lru" else (2,):  # 2 = the router's top_k of the 4 experts
        llm = engine(q, expert_cache={"experts_per_layer": budget, "policy": policy})
        assert run(llm, prompts) == resident, (scheme, policy, budget)
        s = llm.stats()
        assert s["offload/misses"] > 0 and s["offload/loads"] > 0
        if policy == "ondemand":
            assert s["offload/hits"] == 0


@pytest.mark.parametrize("scheme", SCHEMES)
def test_slots_hold_the_stored_tensors_and_loads_count_stored_bytes(quantized, prompts, scheme):
    q, _ = quantized(scheme)
    resident_experts, per_expert = stored_bytes(q)
    llm = engine(q, expert_cache={"experts_per_layer": 2, "policy": "lru"})
    run(llm, prompts)
    full_precision = 3 * resident_experts.hidden * resident_experts.d_model * 4  # fp32 gate, up, down
    assert per_expert < full_precision / 3  # quantized: under a third of fp32 for every scheme here
    for cache in llm.offload.caches.values():
        stored = {k: v for k, v in resident_experts._buffers.items() if v is not None}
        assert set(cache.slots) == set(stored)
        for name, slot in cache.slots.items():
            assert slot.dtype == stored[name].dtype and slot.shape[1:] == stored[name].shape[1:], name
        assert cache.expert_bytes == per_expert
        assert cache.stats.bytes_moved == cache.stats.loads * per_expert > 0
    slow = llm.offload.caches[0].slow
    assert os.path.getsize(slow.path) < 2 * len(llm.offload.caches) * 4 * per_expert  # the stored form on disk
    assert llm.stats()["offload/bytes_moved"] == sum(c.stats.loads for c in llm.offload.caches.values()) * per_expert


def test_memory_budget_counts_stored_bytes(quantized, prompts):
    q, resident = quantized("int4")
    _, per_expert = stored_bytes(q)
    # room for 3 stored experts in each of the 2 MoE layers (at fp32 it would be 0: below top_k, refused)
    llm = engine(q, expert_cache={"memory": 3 * 2 * per_expert + 1, "policy": "lfu"})
    assert llm.stats()["offload/experts_per_layer"] == 3
    assert run(llm, prompts) == resident


@pytest.mark.parametrize("scheme", ["int4", "mxfp4"])
def test_top_4_routing_chunked_matches_resident(prompts, scheme):
    # 4 experts per token, 4 slots of 8: prefills need all 8, so every layer runs in chunks
    wide = build_model(260, seed=3, n_experts=8)
    wide.set_routing(top_k=4)
    q = LLM.from_model(wide, quantization=SCHEMES[scheme], **ENGINE).model
    llm = engine(q, expert_cache={"experts_per_layer": 4, "policy": "lru"})
    assert run(llm, prompts) == run(engine(q), prompts)
    assert llm.stats()["offload/misses"] > 8 * 2


def test_on_rows_runs_the_module_on_a_subset():
    # the chunk's module with rows (2, 0) of a quantized module equals the resident one on tokens
    # routed to those experts; id 2 (= rows) is the dropped assignment
    g = torch.Generator().manual_seed(0)
    from moe.quant.schemes import get_scheme
    full = QuantExperts(get_scheme("int8"), torch.randn(3, 8, 4, generator=g), torch.randn(3, 4, 4, generator=g))
    x_TD = torch.randn(5, 4, generator=g)
    experts_TK = torch.tensor([[0, 2], [2, 2], [0, 0], [2, 1], [1, 0]])
    weights_TK = torch.rand(5, 2, generator=g)
    sub = on_rows(template(full), {k: v[[2, 0]] for k, v in full._buffers.items() if v is not None})
    assert sub.n_experts == 2 and full.n_experts == 3  # the template is a copy
    row_of = torch.tensor([1, 2, 0, 2])  # expert 0 -> row 1, 2 -> row 0, 1 -> dropped
    kept = torch.where(experts_TK == 1, 3, experts_TK)  # the resident run without expert 1
    assert torch.equal(sub(x_TD, row_of[experts_TK], weights_TK), full(x_TD, kept, weights_TK))


def test_unknown_experts_module_refused():
    class Odd(nn.Module):
        n_experts = 2

    with pytest.raises(ConfigError, match="layer 3's experts are Odd: serve this model without expert_cache"):
        check_experts(3, Odd())
