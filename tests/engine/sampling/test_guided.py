"""Grammar-constrained decoding in the engine (moe/engine/sampling/guided.py): the request options, the
vocabulary xgrammar sees for the project's tokenizers (byte-level decoding, special tokens), the
bitmask layout, outputs that match their regex / choice / grammar / schema in mixed batches,
unconstrained requests unchanged, the compiled-grammar cache and bad specs."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from moe.engine import LLM, GuidedParams, SamplingParams
from moe.engine.sampling.guided import GuidedDecoder, pack_bitmask, tokenizer_info
from moe.errors import RequestError

TEXTS = ["the quick brown fox", " héllo wörld, naïve café — ✓ 日本語 テスト", '{"a": [1, 2.5e-3], "b": null}',
         "experts route tokens;\nthe router\tpicks", "<|end|> is text here"]
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "color": {"enum": ["red", "green", "blue"]},
    "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
    "required": ["name", "age", "color", "tags"]}


@pytest.fixture(scope="module")
def llm(bpe_model, bpe_tok):
    return LLM.from_model(bpe_model, bpe_tok, seed=0, collect_routing_stats=False)


def test_guided_params_take_exactly_one_valid_spec():
    assert GuidedParams(json='{"type": "object"}').json == {"type": "object"}  # JSON text is parsed
    assert GuidedParams(choice=("a", "b")).kind == "choice"
    assert SamplingParams(guided={"regex": "a+"}).guided == GuidedParams(regex="a+")
    assert GuidedParams(json={"b": 1, "a": 2}).key() == GuidedParams(json={"a": 2, "b": 1}).key()
    for bad in ({}, {"regex": "a", "choice": ["a"]}, {"json": "[1"}, {"json": [1]}, {"regex": ""},
                {"choice": []}, {"choice": ["a", 1]}, {"grammar": 3}, {"json_object": "yes"}, {"jsonschema": {}}):
        with pytest.raises(RequestError) as e:
            SamplingParams(guided=bad)
        assert e.value.param == "guided", bad
    with pytest.raises(RequestError, match="GuidedParams or a dict"):
        SamplingParams(guided="a+")


@pytest.mark.parametrize("kind", ["bpe", "hf"])
def test_vocabulary_decodes_as_the_tokenizer_does(bpe_tok, tmp_path, kind):
    """Token by token, xgrammar's bytes concatenate to the text the engine decodes (byte-level
    BPE: a character may span tokens; "<|end|>" in a text is the special token, which decodes
    to nothing); special tokens are special (no text), eos is the stop token."""
    tok = bpe_tok
    if kind == "hf":
        from moe.hf.io import HFTokenizer
        tok = HFTokenizer.load(bpe_tok.save(tmp_path / "tok"))
    info = tokenizer_info(tok, tok.vocab_size + 5, [tok.eos_id])  # a model vocab padded past the tokenizer's
    vocab = info.decoded_vocab
    for text in TEXTS:
        ids = tok.encode(text)
        assert b"".join(vocab[i] for i in ids) == tok.decode(ids).encode(), text
        assert tok.decode(ids) == text.replace("<|end|>", "")
    specials = set(bpe_tok.special_ids.values())
    assert specials - {tok.eos_id} <= set(info.special_token_ids)
    assert info.stop_token_ids == [tok.eos_id] and info.vocab_size == tok.vocab_size + 5
    assert all(vocab[i] == b"" for i in specials)
    assert all(vocab[i] != b"" for i in range(len(specials), tok.vocab_size))


def test_bitmask_packing_matches_xgrammar():
    import xgrammar as xgr
    allowed = torch.rand(70, generator=torch.Generator().manual_seed(0)) < 0.5
    allowed[31] = allowed[63] = True  # the sign bits of the int32 words
    logits = torch.zeros(1, 70)
    xgr.apply_token_bitmask_inplace(logits, pack_bitmask(allowed).unsqueeze(0), vocab_size=70)
    assert torch.equal(logits[0] == 0, allowed)


def test_json_rows_never_allow_raw_control_characters(bpe_tok):
    """Inside a maxLength-bounded string xgrammar 0.2.9 itself allows tokens holding raw
    control characters (mlc-ai/xgrammar#800); the decoder's JSON mask removes exactly those."""
    dec = GuidedDecoder(bpe_tok, bpe_tok.vocab_size, bpe_tok.eos_id)
    g = dec.matcher(GuidedParams(json=SCHEMA))
    for t in bpe_tok.encode('{"name": "ab'):
        assert g.accept_token(t)
    ours = dec.wait(dec.start_masks([g, None]))
    raw = torch.full_like(ours[:1], -1)
    g.matcher.fill_next_token_bitmask(raw, 0)
    vocab = dec.info.decoded_vocab

    def allowed(mask):
        return {i for i in range(bpe_tok.vocab_size) if mask[i // 32] >> (i % 32) & 1}
    control = {i for i, b in enumerate(vocab) if any(c < 0x20 for c in b)}
    assert control & allowed(raw[0])  # xgrammar alone lets them in ...
    assert allowed(ours[0]) == allowed(raw[0]) - control  # ... the mask takes out those and nothing else
    assert bool((ours[1] == -1).all())  # an unconstrained row stays all-allowed


def test_outputs_match_their_regex_choice_grammar_and_schema(llm):
    """temperature > 0, one batch mixing every kind with unconstrained requests."""
    specs = [({"regex": r"[0-9]{3}-[a-z]{2,4}"}, lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", t)),
             ({"choice": ["quick fox", "lazy dog", "日本"]}, lambda t: t in ("quick fox", "lazy dog", "日本")),
             ({"grammar": 'root ::= ("red" | "blue") " " [0-9]+ "."'}, lambda t: re.fullmatch(r"(red|blue) \d+\.", t)),
             ({"json": SCHEMA}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None)]
    params, checks = [], []
    for seed in range(3):
        for spec, check in specs:
            params.append(SamplingParams(temperature=1.0, seed=seed, max_tokens=80, guided=spec))
            checks.append(check)
        params.append(SamplingParams(temperature=1.0, seed=seed, max_tokens=8))
        checks.append(None)
    outs = llm.generate(["the fox"] * len(params), params)
    for o, check in zip(outs, checks):
        if check is not None:
            assert o.finish_reason == "stop" and o.token_ids[-1] == llm.eos_id, (o.text, o.finish_reason)
            assert check(o.text), o.text
    assert len({o.text for o, c in zip(outs, checks) if c is not None}) > 4  # sampled, not one fixed answer
    s = llm.stats()
    assert s["guided_steps"] > 0 and s["guided_cache_misses"] == 4 and s["guided_cache_hits"] >= 8


def test_unconstrained_greedy_output_is_unchanged(make_model, bpe_tok, naive):
    """Greedy requests give the reference tokens, alone or batched with guided requests; an
    engine that never saw a guided request never built the guided machinery."""
    model = make_model(bpe_tok.vocab_size, seed=1)
    prompts = [bpe_tok.encode(p) for p in ("the quick brown", "experts route", "héllo")]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    ref = [naive(model, p, 12) for p in prompts]
    plain = LLM.from_model(model, bpe_tok, collect_routing_stats=False)
    assert [o.token_ids for o in plain.generate(prompts, greedy)] == ref
    assert plain._guided is None and "guided_steps" not in plain.stats()
    mixed = LLM.from_model(model, bpe_tok, collect_routing_stats=False)
    guided = SamplingParams(temperature=0.8, seed=1, max_tokens=12, guided={"regex": "[a-z ]{1,11}"})
    outs = mixed.generate(prompts + prompts, [greedy] * 3 + [guided] * 3)
    assert [o.token_ids for o in outs[:3]] == ref
    assert all(re.fullmatch("[a-z ]{1,11}", o.text) for o in outs[3:])


def test_ignore_eos_still_ends_with_the_grammar(llm):
    o = llm.generate("the", SamplingParams(temperature=1.0, seed=0, max_tokens=50, ignore_eos=True,
                                           guided={"choice": ["yes", "no"]}))[0]
    assert o.text in ("yes", "no") and o.finish_reason == "stop" and o.token_ids[-1] == llm.eos_id


@pytest.mark.parametrize("spec, message", [
    ({"json": {"type": "objectx"}}, "Unsupported type"), ({"regex": "a(b"}, "parenthesis"),
    ({"grammar": "root ::= x"}, "not defined")])
def test_invalid_specs_are_request_errors(llm, spec, message):
    ids = llm.tokenizer.encode("hi")
    with pytest.raises(RequestError, match=f"invalid guided .*{message}") as e:
        llm.validate_request(ids, SamplingParams(guided=spec))
    assert e.value.param == "guided" and "/project/" not in str(e.value)  # xgrammar's source location cut
    out = llm.generate(ids, SamplingParams(guided=spec))[0]  # through generate: that request fails alone
    assert out.finish_reason == "error" and "invalid guided" in out.error


def test_needs_a_supported_tokenizer(make_model, tokenizer_cls):
    llm = LLM.from_model(make_model(260), tokenizer_cls(), collect_routing_stats=False)
    with pytest.raises(RequestError, match="vocabulary of the tokenizer") as e:
        llm.validate_request([5, 6], SamplingParams(guided={"regex": "a"}))
    assert e.value.param == "guided"
