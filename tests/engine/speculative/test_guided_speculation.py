"""Speculative decoding of guided (structured output) requests: each verification row is masked
by the grammar's state after the drafts before it (`GuidedDecoder.mask_drafts`), so greedy outputs
equal the plain guided engine's for every method, sampled outputs keep to the grammar, and the
matcher is left where it was (the engine advances it over the tokens verification emits)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from moe.engine import LLM, SamplingParams

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "n"]}
GUIDES = [({"regex": r"(the |fox |dog ){2,6}"}, lambda t: re.fullmatch(r"(the |fox |dog ){2,6}", t)),
          ({"choice": ["the quick brown fox", "the lazy dog", "experts route"]},
           lambda t: t in ("the quick brown fox", "the lazy dog", "experts route")),
          ({"json": SCHEMA}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
          ({"grammar": 'root ::= ("red" | "blue") " " [0-9]+ "."'}, lambda t: re.fullmatch(r"(red|blue) \d+\.", t))]
PROMPTS = ["the quick brown fox jumps over the lazy dog. the quick brown", "experts route tokens; the router"]


def spec_of(method: str, model, make_model) -> dict:
    if method == "draft":  # a different model: its proposals are often rejected, often off-grammar
        return {"method": "draft", "model": make_model(model.cfg.vocab_size, seed=7), "num_tokens": 3}
    if method == "self":
        return {"method": "self", "top_k": 1, "num_tokens": 3}
    return {"method": "ngram", "num_tokens": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def plain(bpe_model, bpe_tok):
    return LLM.from_model(bpe_model, bpe_tok, collect_routing_stats=False)


@pytest.mark.parametrize("method", ["ngram", "self", "draft"])
def test_greedy_guided_outputs_equal_the_plain_engine(method, bpe_model, bpe_tok, make_model, plain):
    llm = LLM.from_model(bpe_model, bpe_tok, collect_routing_stats=False,
                         speculative=spec_of(method, bpe_model, make_model))
    params = [SamplingParams(temperature=0, max_tokens=40, guided=g, logprobs=2) for g, _ in GUIDES]
    params += [SamplingParams(temperature=0, max_tokens=12)]  # an unconstrained request in the same batch
    prompts = [p for p in PROMPTS for _ in params]
    params = params * len(PROMPTS)
    ref = plain.generate(prompts, [SamplingParams(**{**p.__dict__, "speculative": "off"}) for p in params])
    outs = llm.generate(prompts, params)
    for o, r in zip(outs, ref):
        assert (o.token_ids, o.text, o.finish_reason) == (r.token_ids, r.text, r.finish_reason)
        assert (o.logprobs is None) == (r.logprobs is None)
        for a, b in zip(o.logprobs or [], r.logprobs or []):  # reported unmasked, as the plain engine does
            assert a.keys() == b.keys() and all(abs(a[t] - b[t]) < 1e-4 for t in a)
    checks = ([c for _, c in GUIDES] + [None]) * len(PROMPTS)
    assert len(checks) == len(outs)
    for o, check in zip(outs, checks):
        if check is not None and o.finish_reason == "stop":
            assert check(o.text), o.text
    st = llm.stats()
    assert st["spec_proposed"] > 0 and st["guided_steps"] > 0
    if method == "draft":
        assert st["spec_accepted"] < st["spec_proposed"]  # rejections happened under the masks


def test_sampled_guided_outputs_keep_to_the_grammar(bpe_model, bpe_tok, make_model):
    llm = LLM.from_model(bpe_model, bpe_tok, collect_routing_stats=False,
                         speculative=spec_of("draft", bpe_model, make_model))
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=60, guided=g) for s in range(3) for g, _ in GUIDES]
    outs = llm.generate([PROMPTS[0]] * len(params), params)
    for o, (_g, check) in zip(outs, GUIDES * 3):
        assert o.finish_reason == "stop" and check(o.text), (o.text, o.finish_reason)
    assert llm.stats()["spec_proposed"] > 0


def test_mask_drafts_masks_each_row_at_its_grammar_state_and_restores_the_matcher(bpe_model, bpe_tok, plain):
    guided = plain.guided_decoder()
    spec = SamplingParams(guided={"choice": ["the lazy dog", "the quick brown fox"]}).guided
    tokens = bpe_tok.encode("the quick brown fox")
    V = plain.vocab_size

    def row_mask(prefix: list[int]) -> torch.Tensor:  # the plain path's mask after `prefix`
        g = guided.matcher(spec)
        for t in prefix:
            assert g.accept_token(t)
        logits = torch.zeros(1, V)
        guided.mask_drafts(g, [], logits)
        return torch.isfinite(logits[0])

    g = guided.matcher(spec)
    logits = torch.zeros(len(tokens) + 1, V)
    guided.mask_drafts(g, tokens, logits)
    for j in range(len(tokens) + 1):
        assert torch.equal(torch.isfinite(logits[j]), row_mask(tokens[:j])), j
        if j < len(tokens):
            assert bool(torch.isfinite(logits[j, tokens[j]]))  # each draft allowed where it stands
    assert torch.isfinite(logits[-1]).sum() == 1  # after the whole choice: only the stop token
    # the matcher was rolled back: it still accepts the choice from its start
    assert all(g.accept_token(t) for t in tokens)

    # a draft the grammar refuses: its row forbids it; later rows are left unmasked
    bad = bpe_tok.encode("the lazy")[:1] + bpe_tok.encode(" router")
    g = guided.matcher(spec)
    logits = torch.zeros(len(bad) + 1, V)
    guided.mask_drafts(g, bad, logits)
    assert not bool(torch.isfinite(logits[1, bad[1]]))
    assert bool(torch.isfinite(logits[2]).all())
    assert g.accept_token(bad[0])  # rolled back over the accepted first draft


def test_drafted_and_plain_guided_requests_in_one_batch(bpe_model, bpe_tok, make_model, plain):
    """Guided requests that speculate next to guided requests that do not (speculative='off'):
    each plain row keeps its own grammar's mask once the drafted rows are verified apart."""
    llm = LLM.from_model(bpe_model, bpe_tok, collect_routing_stats=False,
                         speculative=spec_of("draft", bpe_model, make_model))
    params, prompts = [], []
    for i, (g, _) in enumerate(GUIDES * 2):
        params.append(SamplingParams(temperature=0, max_tokens=40, guided=g, speculative="off" if i % 2 else None))
        prompts.append(PROMPTS[i % 2])
    ref = plain.generate(prompts, [SamplingParams(temperature=0, max_tokens=40, guided=p.guided) for p in params])
    outs = llm.generate(prompts, params)
    assert [(o.token_ids, o.finish_reason) for o in outs] == [(r.token_ids, r.finish_reason) for r in ref]
    assert sum(o.metrics.spec_proposed > 0 for o in outs) == len(GUIDES)  # the others never drafted


def test_a_guided_prefill_finishing_while_guided_drafts_are_verified(bpe_model, bpe_tok, make_model, plain):
    """A request whose prompt completes (its first token sampled plainly, under its grammar) in
    a step where earlier guided requests verify drafts: the batch then holds drafted rows before
    the plain one, and each must keep its own grammar's mask."""
    llm = LLM.from_model(bpe_model, bpe_tok, collect_routing_stats=False,
                         speculative=spec_of("draft", bpe_model, make_model))
    first = [SamplingParams(temperature=0, max_tokens=40, guided=GUIDES[0][0]),
             SamplingParams(temperature=0, max_tokens=40, guided=GUIDES[2][0])]
    late = SamplingParams(temperature=0, max_tokens=40, guided=GUIDES[1][0])
    rids = [llm.add_request(PROMPTS[i], p) for i, p in enumerate(first)]
    outs = {}
    for _ in range(3):  # the first two are decoding (and drafting) by now
        for ev in llm.step():
            if ev.finished:
                outs[ev.request_id] = ev.output
    rids.append(llm.add_request(PROMPTS[0], late))
    while llm.has_unfinished_requests():
        for ev in llm.step():
            if ev.finished:
                outs[ev.request_id] = ev.output
    ref = plain.generate([PROMPTS[0], PROMPTS[1], PROMPTS[0]], first + [late])
    assert [outs[r].token_ids for r in rids] == [r.token_ids for r in ref]
    assert llm.stats()["spec_proposed"] > 0
