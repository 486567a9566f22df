"""`CompiledModelRunner` (`LLM(..., compile=True)`): greedy outputs equal the eager engine's and
the naive loop's, each token's log-prob equals one full fp32 forward's, padding rows leave the
sequences' cache alone, and the static-shape expert dispatch equals the reference loop."""

import copy

import pytest
import torch

from moe.engine import LLM, SamplingParams
from moe.engine.runner.compiled import batch_buckets, dense_experts, gathered_experts
from moe.experts.loop import loop_dispatch
from tests.engine.core.test_logprob_parity import attention_heavy, check_parity


def test_buckets():
    assert batch_buckets(1) == [1]
    assert batch_buckets(6) == [1, 2, 4, 6]
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 32, 64]


def test_static_dispatches_equal_the_loop():
    g = torch.Generator().manual_seed(0)
    T, D, H, E, K = 7, 16, 24, 5, 2
    x = torch.randn(T, D, generator=g)
    experts = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    weights = torch.rand(T, K, generator=g)
    gate_up, down = torch.randn(E, 2 * H, D, generator=g), torch.randn(E, D, H, generator=g)
    ref = loop_dispatch(x, experts, weights, gate_up, down)
    assert torch.allclose(gathered_experts(x, experts, weights, gate_up, down), ref, atol=1e-4)
    assert torch.allclose(dense_experts(x, experts, weights, gate_up, down), ref, atol=1e-4)


@pytest.mark.slow
def test_compiled_greedy_equals_eager(model, make_prompts, naive):
    # three prompts of one length and one output length: every decode step is a batch of 3, padded
    # to the bucket of 4 (one compiled graph, one padding row). The model's attention is made
    # sharp (test_logprob_parity.attention_heavy) so that the log-probs depend on the cached K/V.
    heavy = attention_heavy(copy.deepcopy(model))
    prompts = make_prompts([6, 6, 6], seed=3)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
    opts = dict(max_num_seqs=4, max_model_len=32, collect_routing_stats=False)
    eager = LLM.from_model(heavy, None, **opts).generate(prompts, params)
    llm = LLM.from_model(heavy, None, compile=True, **opts)
    outs = check_parity(llm, heavy, prompts, params)  # every token's log-prob vs one full forward (1e-4)
    assert llm.runner.num_compiled_steps == 7  # every step after the prefill
    assert [o.token_ids for o in outs] == [o.token_ids for o in eager] == [naive(heavy, p, 8) for p in prompts]
    assert llm.stats()["kv_blocks_used"] == 0
