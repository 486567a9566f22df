"""Speculative decoding through the engine (`moe.engine.speculative.decoder` and `.step`): greedy
outputs equal to the plain engine's and to a naive recompute loop for every method, with
preemption, prefix caching and chunked prefill in play, and the block managers (the target's and
each drafting cache's) checked after every step: no leaked or double-counted block, prefix-cache
hashes only over verified tokens, no proposal left behind."""

import pytest
import torch

from moe.engine import LLM, SamplingParams
from moe.engine.memory.block_manager import hash_block

MAX_TOKENS = 14


def check_blocks(bm, seqs) -> None:
    """Every block is free, evictable or owned; reference counts equal the owners counted."""
    owners: dict[int, int] = {}
    for s in seqs:
        for b in s.block_table:
            owners[b] = owners.get(b, 0) + 1
    free, evictable = list(bm.free_ids), list(bm.evictable)
    assert len(set(free)) == len(free) and not set(free) & set(evictable), "a block listed twice"
    assert not set(owners) & (set(free) | set(evictable)), "a block both owned and free"
    assert len(owners) + len(free) + len(evictable) == bm.num_blocks, "a leaked block"
    for b in bm.blocks:
        assert b.ref_count == owners.get(b.block_id, 0), f"block {b.block_id}: ref {b.ref_count}"
        if b.block_id in evictable:
            assert b.hash is not None and bm.hash_to_block[b.hash] == b.block_id
    for h, bid in bm.hash_to_block.items():
        assert bm.blocks[bid].hash == h


def check_engine(llm) -> None:
    eng = llm
    running, waiting = eng.scheduler.running, list(eng.scheduler.waiting)
    check_blocks(eng.block_manager, running + waiting)
    bs = eng.block_size
    for s in running + waiting:
        assert s.num_draft_tokens == 0 and s.draft_probs is None, "a proposal outlived its step"
        assert not s.block_table or len(s.block_table) <= -(-s.num_tokens // bs)
        assert s.num_computed_tokens <= s.num_tokens - 1 or not s.block_table
        parent = None  # the sequence's hashes chain over its own (verified) tokens
        for i, h in enumerate(s.block_hashes):
            parent = hash_block(parent, s.token_ids[i * bs:(i + 1) * bs])
            assert h == parent
    for p in eng.spec.proposers.values():
        if hasattr(p, "bm"):
            check_blocks(p.bm, list(p.shadows.values()))
            assert set(p.shadows) <= {s.request_id for s in running}


def run_checked(llm, prompts, params, check=check_engine):
    """Generate step by step, running `check(llm)` after every step; the outputs in prompt order."""
    rids = [llm.add_request(p, params) for p in prompts]
    outs = {}
    while llm.has_unfinished_requests():
        for ev in llm.step():
            if ev.finished:
                outs[ev.request_id] = ev.output
        check(llm)
    return [outs[r] for r in rids]


@pytest.fixture(scope="module")
def prompts(make_prompts):
    ps = make_prompts([5, 21, 9, 40, 3], seed=7)
    shared = ps[3][:36]  # prefix-cache hits: the same 36-token prefix as prompt 3 (9 blocks of 4)
    return ps + [shared + [11, 12], [20, 21, 22, 23] * 5]


SPECS = {
    "ngram": {"method": "ngram", "num_tokens": 3},
    "self_top1": {"method": "self", "top_k": 1, "num_tokens": 4},
    "self_skip": {"method": "self", "top_k": None, "skip_layers": [1], "num_tokens": 2},
    "draft_same": "target",  # the target's own weights as the draft: every proposal accepted
    "draft_other": "other",  # an unrelated small model: most proposals rejected
}


def make_spec(name, model, make_model):
    spec = SPECS[name]
    if spec == "target":
        return {"method": "draft", "model": model, "num_tokens": 3}
    if spec == "other":
        return {"method": "draft", "model": make_model(260, seed=5, n_layers=1), "num_tokens": 3}
    return spec


# 20 blocks of 4 tokens for 7 sequences of up to 54 tokens: preemption; 24 tokens a step: chunked prefill
OPTS = dict(block_size=4, num_blocks=20, max_num_batched_tokens=24, collect_routing_stats=False)
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(model, naive, prompts):
    ref = [naive(model, p, MAX_TOKENS) for p in prompts]
    assert [o.token_ids for o in LLM.from_model(model, None, **OPTS).generate(prompts, GREEDY)] == ref
    return ref


@pytest.mark.parametrize("name", list(SPECS))
def test_greedy_equals_plain_engine_and_naive_loop(name, model, make_model, reference, prompts):
    """(`reference` holds the naive loop's outputs, checked equal to the plain engine's.)"""
    llm = LLM.from_model(model, None, speculative=make_spec(name, model, make_model), **OPTS)
    outs = run_checked(llm, prompts, GREEDY)
    assert [o.token_ids for o in outs] == reference
    st = llm.stats()
    assert st["num_preemptions"] > 0 and st["prefix_cache_hits"] > 0
    assert st["kv_blocks_used"] == 0  # everything released at the end
    assert st["spec_proposed"] > 0 and st["spec_steps"] > 0
    assert st["spec_proposed"] == sum(o.metrics.spec_proposed for o in outs)
    assert st["spec_accepted"] == sum(o.metrics.spec_accepted for o in outs)
    assert st["spec_acceptance_rate"] == pytest.approx(st["spec_accepted"] / st["spec_proposed"])
    if name == "draft_same":
        assert st["spec_acceptance_rate"] == 1.0
    # every step emits its accepted proposals plus at most one token of the target's own
    assert st["spec_accepted"] <= st["spec_emitted"] <= st["spec_accepted"] + st["spec_steps"]


def test_per_request_choice_and_off(model, prompts):
    llm = LLM.from_model(model, None, block_size=4, num_blocks=80, speculative="ngram", collect_routing_stats=False)
    on = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    off = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, speculative="off")
    selfp = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, speculative={"method": "self"})
    a, b, c = llm.generate([prompts[-1]] * 3, [on, off, selfp])
    assert a.token_ids == b.token_ids == c.token_ids
    assert a.metrics.spec_proposed > 0 and b.metrics.spec_proposed == 0 and c.metrics.spec_proposed > 0
    assert a.metrics.spec_mean_accepted_length == a.metrics.spec_accepted / a.metrics.spec_steps


def test_stop_inside_accepted_proposals_and_logprobs(model):
    """A stop token among accepted proposals ends the request there, as plain decoding does;
    logprobs come out for every emitted token, equal to the plain engine's."""
    prompt = [20, 21, 22, 23] * 5
    plain = LLM.from_model(model, None, collect_routing_stats=False)
    full = plain.generate(prompt, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))[0]
    stop = full.token_ids[5]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop_token_ids=[stop], logprobs=2)
    want = plain.generate(prompt, params)[0]
    llm = LLM.from_model(model, None, speculative={"method": "draft", "model": model}, collect_routing_stats=False)
    got = llm.generate(prompt, params)[0]
    assert got.token_ids == want.token_ids and got.finish_reason == "stop" and got.stop_reason == stop
    assert len(got.logprobs) == len(got.token_ids)
    for g, w in zip(got.logprobs, want.logprobs):
        assert g.keys() == w.keys()
        assert all(abs(g[t] - w[t]) < 1e-4 for t in g)


def test_max_tokens_and_max_model_len_are_never_exceeded(model):
    llm = LLM.from_model(model, None, max_model_len=30, speculative={"method": "draft", "model": model,
                                                                     "num_tokens": 6}, collect_routing_stats=False)
    a, b = llm.generate([[5] * 20, [6] * 4], SamplingParams(temperature=0, max_tokens=7, ignore_eos=True))
    assert len(a.token_ids) == 7 and a.finish_reason == "length"
    assert len(b.token_ids) == 7
    c = llm.generate([5] * 25, SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))[0]
    assert len(c.token_ids) == 5  # 25 + 5 = max_model_len


def test_speculation_over_an_fp8_kv_cache_equals_the_plain_fp8_engine(model, prompts):
    """The verifier reads and rolls back the target's FP8 cache (values and per-token scales) like the
    full-precision one: the same greedy tokens as the plain engine over the same FP8 cache."""
    opts = dict(OPTS, kv_cache_dtype="fp8_e4m3")
    plain = [o.token_ids for o in LLM.from_model(model, None, **opts).generate(prompts, GREEDY)]
    llm = LLM.from_model(model, None, speculative="ngram", **opts)
    assert [o.token_ids for o in run_checked(llm, prompts, GREEDY)] == plain
    assert llm.stats()["spec_accepted"] > 0
