"""An engine serving a model whose layers all slide frees the KV blocks its window passed
(moe.engine.memory.block_manager): greedy output still equals a naive recompute (and HF generate())
on prompts + outputs many windows long, with prefix caching, chunked prefill, preemption and
speculative decoding; the blocks a sequence holds stay bounded by its window while a full-attention
model's grow; requests longer than the cache are admitted when their window fits. The invariant
checks (tests/conftest.py turns them on) run after every step: a released block that a query still
sees, or a held count over the window's bound, fails there."""

import pytest
import torch

from moe.engine import LLM, SamplingParams
from moe.engine.memory.block_manager import NULL_BLOCK
from moe.errors import RequestError
from tests.engine.conftest import build_model, naive_greedy, random_prompts
from tests.hf_fixtures import random_ids

WINDOW, BS, MAX_TOKENS = 6, 4, 24
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)


def sliding_model(layer_types=None, window=WINDOW, **kw):
    model = build_model(260, seed=4, n_layers=2, layer_types=layer_types, sliding_window=window,
                        attention_sinks=True, max_seq_len=128, **kw)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-zero sinks (GPT-OSS-like: they start at 0)
        for layer in model.layers:
            layer.attn.sinks.copy_(torch.randn(layer.attn.sinks.shape, generator=g))
    return model


@pytest.fixture(scope="module")
def model():
    return sliding_model()


@pytest.fixture(scope="module")
def prompts():
    # (the last repeats a 4-token pattern: the n-gram proposer has something to propose)
    return random_prompts([5, 23, 41], seed=7) + [[20, 21, 22, 23] * 6]


@pytest.fixture(scope="module")
def reference(model, prompts):
    return [naive_greedy(model, p, MAX_TOKENS) for p in prompts]


CASES = {
    "plain": dict(num_blocks=64),
    "chunked": dict(num_blocks=64, max_num_batched_tokens=7, max_num_seqs=3),
    # 9 blocks of 4: a sequence holds <= 4 (its window and an 8-token chunk), four of them do not fit
    "preempt": dict(num_blocks=9, max_num_batched_tokens=8),
    "spec": dict(num_blocks=64, speculative="ngram"),
    "spec-preempt-chunked": dict(num_blocks=10, max_num_batched_tokens=9, speculative="ngram"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_equals_naive_recompute(case, model, prompts, reference):
    llm = LLM.from_model(model, None, attention_backend="torch", block_size=BS, collect_routing_stats=False,
                         **CASES[case])
    assert llm.sliding_window == WINDOW
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == reference
    st = llm.stats()
    assert st["kv_blocks_used"] == 0  # everything released at the end
    if "preempt" in case:
        assert st["num_preemptions"] > 0
    if "spec" in case:
        assert st["spec_proposed"] > 0 and st["spec_accepted"] > 0


def test_draft_model_speculation_with_a_small_cache(model, prompts, reference):
    """The model drafting for itself (its drafter keeps its own full cache): every proposal is
    accepted, so each step verifies several tokens past the released blocks."""
    llm = LLM.from_model(model, None, attention_backend="torch", block_size=BS, num_blocks=7, max_num_batched_tokens=9,
                         speculative={"method": "draft", "model": model}, collect_routing_stats=False)
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == reference
    st = llm.stats()
    assert st["spec_acceptance_rate"] == 1.0 and st["spec_accepted"] > 0


def test_prefix_cache_hits_past_the_window(model, prompts, reference):
    """The same prompts again (whole prefixes cached) and prompts that extend them: hits take only
    the window's blocks, and the outputs still equal the naive recompute."""
    llm = LLM.from_model(model, None, attention_backend="torch", block_size=BS, num_blocks=40,
                         collect_routing_stats=False)
    first = llm.generate(prompts, GREEDY)
    again = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in first] == [o.token_ids for o in again] == reference
    longer = [p + o.token_ids[:7] for p, o in zip(prompts, first)]  # the cache holds these prefixes too
    outs = llm.generate(longer, GREEDY)
    st = llm.stats()
    assert st["prefix_cache_hits"] > sum(len(p) for p in prompts) // 2
    assert [o.token_ids for o in outs] == [naive_greedy(model, p, MAX_TOKENS) for p in longer]


def held_per_step(llm, prompt, max_tokens):
    """Blocks the request holds after each step (decoding one token a step)."""
    rid = llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    seq, held = llm.requests[rid], []
    while llm.has_unfinished_requests():
        llm.step()
        held.append(sum(1 for b in seq.block_table if b != NULL_BLOCK))
    return held[:-1]  # (the last step finished it: its blocks are released)


def test_blocks_held_stay_bounded_by_the_window_while_full_attention_grows():
    bound = -(-WINDOW // BS) + 1
    slide = LLM.from_model(sliding_model(), None, attention_backend="torch", block_size=BS, num_blocks=64,
                           max_num_batched_tokens=4)
    held = held_per_step(slide, random_prompts([10], seed=3)[0], 90)
    assert max(held[3:]) <= bound and min(held[3:]) >= bound - 1  # prefill chunks of 4, then decodes
    assert slide.stats()["kv_blocks_used"] == 0
    # full attention, and a hybrid model's full-group table (`seq.block_table`; its window group, which frees,
    # has its own table: tests/engine/core/test_hybrid_kv.py)
    for layer_types in (["full", "full"], ["sliding", "full"]):
        kw = dict(window=None) if layer_types == ["full", "full"] else {}
        llm = LLM.from_model(sliding_model(layer_types, **kw), None, attention_backend="torch", block_size=BS,
                             num_blocks=64, max_num_batched_tokens=4)
        assert llm.sliding_window is None
        grows = held_per_step(llm, random_prompts([10], seed=3)[0], 90)
        assert grows[-1] == -(-(10 + 89) // BS) and grows == sorted(grows)


def test_a_request_longer_than_the_cache_is_served_when_its_window_fits(model):
    """8 blocks of 4 = 32 tokens of cache: a 100-token request holds at most 4 blocks (window 6,
    8-token steps) and is served; a full-attention model refuses it on arrival."""
    prompt = random_prompts([30], seed=9)[0]
    params = SamplingParams(temperature=0, max_tokens=70, ignore_eos=True)
    llm = LLM.from_model(model, None, attention_backend="torch", block_size=BS, num_blocks=8, max_num_batched_tokens=8)
    out = llm.generate(prompt, params)[0]
    assert out.token_ids == naive_greedy(model, prompt, 70)
    full = LLM.from_model(sliding_model(["full", "full"], window=None), None, attention_backend="torch",
                          block_size=BS, num_blocks=8, max_num_batched_tokens=8)
    with pytest.raises(RequestError, match="needs up to 25 KV blocks"):
        full.validate_request(prompt, params)
    # a step of up to 64 tokens may need ceil((6 - 1 + 64 + 3) / 4) = 18 blocks: refused on arrival
    wide = LLM.from_model(model, None, attention_backend="torch", block_size=BS, num_blocks=8,
                          max_num_batched_tokens=64)
    with pytest.raises(RequestError, match="needs up to 18 KV blocks"):
        wide.validate_request(prompt, params)


def test_engine_greedy_equals_hf_generate_many_windows_long(hf_dirs):
    """Mixtral with every layer sliding over 5 tokens (tests/hf_fixtures.py): 16 + 24 tokens."""
    directory, hf = hf_dirs("mixtral-window")
    prompts = [random_ids(1, 16, 3)[0].tolist(), random_ids(1, 7, 4)[0].tolist()]
    llm = LLM(str(directory), device="cpu", dtype="fp32", block_size=4, num_blocks=12, max_num_batched_tokens=6)
    assert llm.sliding_window == 5
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            ids = torch.tensor([prompt])
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
        assert out.token_ids == ref[0, len(prompt):].tolist()
