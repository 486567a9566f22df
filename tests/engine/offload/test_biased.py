"""GPT-OSS experts (gate/up and down biases, clamped SwiGLU: `BiasedExperts`) in the expert cache:
the biases travel with their expert's weights, and random GPT-OSS models imported from HF
(tests/hf_fixtures.py) give the resident engine's greedy tokens and log-probabilities for every
policy at a budget of top_k experts per layer, chunked prefills (top-3 of 6 experts in 3 slots),
and GPT-OSS's own MXFP4-quantized experts with their biases."""

from __future__ import annotations

import pytest
import torch

from moe.engine import LLM
from moe.experts.biased import BiasedExperts
from moe.quant.modules import QuantExperts
from tests.engine.conftest import build_model
from tests.engine.offload.engines import ENGINE, POLICIES, engine, mixed_prompts, run
from tests.hf_fixtures import VOCAB

CPU = dict(device="cpu", dtype="fp32", **ENGINE)


@pytest.fixture(scope="module")
def prompts():
    return mixed_prompts(VOCAB)


@pytest.fixture(scope="module")
def gpt_oss(hf_dirs, prompts):
    """top-2 of 4 experts, biases, clamped SwiGLU, sliding-window layers with sinks."""
    directory, _ = hf_dirs("gpt_oss-gqa-alternating")
    return str(directory), run(LLM(str(directory), **CPU), prompts)


@pytest.mark.parametrize("policy", POLICIES)
def test_gpt_oss_matches_resident(gpt_oss, prompts, policy):
    directory, resident = gpt_oss
    llm = LLM(directory, expert_cache={"experts_per_layer": 2, "policy": policy}, **CPU)
    assert run(llm, prompts) == resident
    cache = llm.offload.caches[0]
    assert set(cache.slots) == {"gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias"}
    assert cache.expert_bytes == 4 * (3 * 16 * 32 + 2 * 16 + 32)  # fp32 weights (H=16, D=32) and both biases
    s = llm.stats()
    assert s["offload/misses"] > 0 and s["offload/bytes_moved"] == s["offload/loads"] * cache.expert_bytes
    assert "BiasedExperts" in repr(llm.model.layers[0].ffn.experts)


def test_gpt_oss_top_3_chunked_matches_resident(hf_dirs, prompts):
    # top-3 of 6 experts in 3 slots: a prefill needing more runs in chunks
    directory, _ = hf_dirs("gpt_oss-gqa1-nobias")
    resident = run(LLM(str(directory), **CPU), prompts)
    llm = LLM(str(directory), expert_cache={"experts_per_layer": 3, "policy": "lfu"}, **CPU)
    assert run(llm, prompts) == resident
    assert llm.offload.caches[0].slots["gate_up_proj_bias"].shape == (3, 2 * 16)
    assert llm.stats()["offload/misses"] > 6 * 3


def test_gpt_oss_mxfp4_matches_resident_mxfp4(gpt_oss, prompts):
    # GPT-OSS as published: MXFP4 experts with full-precision biases
    directory, _ = gpt_oss
    resident_llm = LLM(directory, quantization="mxfp4", **CPU)
    experts = resident_llm.model.layers[0].ffn.experts
    assert isinstance(experts, QuantExperts) and experts.activation == "clamped_swiglu"
    llm = LLM(directory, quantization="mxfp4", expert_cache={"experts_per_layer": 2, "policy": "lookahead"}, **CPU)
    assert run(llm, prompts) == run(resident_llm, prompts)
    assert {"gate_up_proj_bias", "down_proj_bias", "gate_up_blocks", "gate_up_scales"} <= set(llm.offload.caches[0].slots)


def test_own_biased_model_matches_resident(prompts):
    # the project's own `model.expert_bias` (sorted dispatch) through the same cache
    model = build_model(VOCAB, seed=5, expert_bias=True)
    with torch.no_grad():  # biases start at zero; make them matter
        for name, p in model.named_parameters():
            if name.endswith("_bias") and "experts" in name:
                p.normal_()
    assert isinstance(model.layers[0].ffn.experts, BiasedExperts)
    llm = engine(model, expert_cache={"experts_per_layer": 2, "policy": "lru"})
    assert run(llm, prompts) == run(engine(model), prompts)
