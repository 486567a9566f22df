"""moe/engine/sampling/guided.py, exactly: the request options and their messages, the cache key,
the compiled-grammar cache, the bitmask, the per-step masks and their timing counters, the draft
masks of speculative decoding. Added for the mutants of docs/results/mutation/run4_features/ and
run6_mutG/ that test_guided.py's end-to-end checks let through (a regex `match=` passes whatever
a message is replaced by; sampled outputs that keep to the grammar say nothing of a counter)."""

from __future__ import annotations

import types
from concurrent.futures import Future

import pytest
import torch

from moe.engine.sampling import guided as guided_mod
from moe.engine.sampling.guided import (KINDS, GuidedDecoder, GuidedParams, _clean, choice_grammar, pack_bitmask,
                                        special_token_ids)
from moe.errors import RequestError

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}}, "required": ["name"]}


def test_clean_cuts_the_time_and_source_prefix_and_keeps_the_first_line():
    e = RuntimeError("[12:34:56] /project/cpp/grammar_parser.cc:87: Rule \"x\" is not defined\nstack trace")
    assert _clean(e) == 'Rule "x" is not defined'
    assert _clean(ValueError("  no prefix here\nsecond  ")) == "no prefix here"


def test_clean_names_the_exception_type_when_the_message_is_empty():
    assert _clean(ValueError("")) == "ValueError"
    assert _clean(RuntimeError("   ")) == "RuntimeError"


# ---------------------------------------------------------------------------- the request options
def _error(make) -> RequestError:
    with pytest.raises(RequestError) as e:
        make()
    assert e.value.param == "guided"
    return e.value


@pytest.mark.parametrize("kw, message", [
    ({}, f"guided decoding takes exactly one of {list(KINDS)}; got none"),
    ({"regex": "a", "choice": ["a"]}, f"guided decoding takes exactly one of {list(KINDS)}; got ['regex', 'choice']"),
    ({"grammar": "root ::= \"a\"", "json_object": True},
     f"guided decoding takes exactly one of {list(KINDS)}; got ['grammar', 'json_object']"),
    ({"json": [1]}, "a JSON schema must be an object; got list"),
    ({"json": "[1]"}, "a JSON schema must be an object; got list"),
    ({"regex": ""}, "the guided regex must be a non-empty string"),
    ({"regex": 3}, "the guided regex must be a non-empty string"),
    ({"grammar": ""}, "the guided grammar must be a non-empty string"),
    ({"grammar": b"root"}, "the guided grammar must be a non-empty string"),
    ({"choice": []}, "the guided choice must be a non-empty list of strings"),
    ({"choice": "ab"}, "the guided choice must be a non-empty list of strings"),
    ({"choice": ["a", 1]}, "the guided choice must be a non-empty list of strings"),
    ({"json_object": 1}, "json_object must be True or False"),
])
def test_each_invalid_option_is_refused_with_its_own_message(kw, message):
    assert str(_error(lambda: GuidedParams(**kw))) == message


def test_json_text_that_does_not_parse_names_the_parser_error():
    msg = str(_error(lambda: GuidedParams(json='{"a": ')))
    assert msg.startswith("the guided JSON schema is not valid JSON: Expecting value")


def test_valid_options_are_kept_in_their_canonical_form():
    assert GuidedParams(json='{"type": "object"}').json == {"type": "object"}
    c = GuidedParams(choice=("a", "b"))
    assert c.choice == ["a", "b"] and type(c.choice) is list
    for kw, kind in [({"json": {}}, "json"), ({"regex": "a+"}, "regex"), ({"choice": ["x"]}, "choice"),
                     ({"grammar": 'root ::= "a"'}, "grammar"), ({"json_object": True}, "json_object"),
                     ({"regex": "a", "json_object": False}, "regex")]:
        assert GuidedParams(**kw).kind == kind


def test_the_cache_key_is_the_kind_and_the_canonical_text():
    assert GuidedParams(json={"b": 1, "a": "é"}).key() == ("json", '{"a": "é", "b": 1}')
    assert GuidedParams(choice=["é", "b"]).key() == ("choice", '["é", "b"]')
    assert GuidedParams(regex="a+").key() == ("regex", "a+")
    assert GuidedParams(grammar='root ::= "a"').key() == ("grammar", 'root ::= "a"')
    assert GuidedParams(json_object=True).key() == ("json_object", "")


def test_coerce_takes_params_and_dicts_and_names_what_it_refuses():
    g = GuidedParams(regex="a")
    assert GuidedParams.coerce(g) is g
    assert GuidedParams.coerce({"choice": ["a"]}) == GuidedParams(choice=["a"])
    assert str(_error(lambda: GuidedParams.coerce({"x": 1, "jsonschema": {}, "regex": "a"}))) == (
        f"unknown guided decoding option(s) ['jsonschema', 'x']; the options are {list(KINDS)}")
    assert str(_error(lambda: GuidedParams.coerce("a+"))) == (
        "guided must be a GuidedParams or a dict like {'json': schema}; got str")


def test_choice_grammar_quotes_each_choice_as_a_json_string():
    assert choice_grammar(["a", 'b"', "é"]) == 'root ::= "a" | "b\\"" | "é"'


# ---------------------------------------------------------------------------- vocabulary, bitmask
def test_pack_bitmask_words_exactly():
    allowed = torch.zeros(70, dtype=torch.bool)
    allowed[[0, 5, 31, 32, 69]] = True
    packed = pack_bitmask(allowed)
    assert packed.dtype == torch.int32
    assert packed.tolist() == [1 + 2 ** 5 - 2 ** 31, 1, 2 ** 5]
    assert pack_bitmask(torch.ones(32, dtype=torch.bool)).tolist() == [-1]
    assert pack_bitmask(torch.ones(33, dtype=torch.bool)).tolist() == [-1, 1]  # a 33rd token: a second word
    only31 = torch.zeros(32, dtype=torch.bool)
    only31[31] = True
    assert pack_bitmask(only31).tolist() == [-2 ** 31]


def test_special_token_ids_of_both_tokenizer_kinds():
    class Hf:
        all_special_ids = [5, None]
        added_tokens_decoder = {7: types.SimpleNamespace(special=True), 8: types.SimpleNamespace(special=False)}

    assert special_token_ids(types.SimpleNamespace(special_ids={"eos": 2, "pad": None})) == {2}
    assert special_token_ids(types.SimpleNamespace(special_ids={"eos": 2}, tok=Hf())) == {2, 5, 7}
    assert special_token_ids(types.SimpleNamespace(tok=Hf())) == {5, 7}
    assert special_token_ids(types.SimpleNamespace(special_ids={"eos": 2}, tok=object())) == {2}  # neither list
    assert special_token_ids(object()) == set()


# ---------------------------------------------------------------------------- the decoder
@pytest.fixture(scope="module")
def dec(bpe_tok):
    return GuidedDecoder(bpe_tok, bpe_tok.vocab_size, bpe_tok.eos_id)


def _allowed(row: torch.Tensor, V: int) -> set[int]:
    return {i for i in range(V) if int(row[i // 32]) >> (i % 32) & 1}


class _Clock:
    """guided.time stand-in: perf_counter returns the given values in order."""

    def __init__(self, *values):
        self.values = list(values)

    def perf_counter(self):
        return self.values.pop(0)


def test_a_decoder_needs_a_tokenizer():
    assert str(_error(lambda: GuidedDecoder(None, 10, 0))) == (
        "structured outputs need a tokenizer (the grammar is over text)")


def test_the_compiled_grammar_cache_is_a_bounded_lru(bpe_tok, dec):
    assert dec.cache_size == 256  # the default bound
    d = GuidedDecoder(bpe_tok, bpe_tok.vocab_size, bpe_tok.eos_id, cache_size=2)
    a, b, c = GuidedParams(regex="a+"), GuidedParams(regex="b+"), GuidedParams(regex="c+")
    ca = d.compile(a)
    d.compile(b)
    assert d.compile(a) is ca  # a hit; a is now the most recently used
    d.compile(c)  # evicts b, the least recently used
    assert list(d.cache) == [a.key(), c.key()]
    assert d.stats()["guided_cache_size"] == 2
    assert (d.cache_hits, d.cache_misses) == (1, 3)
    err = _error(lambda: d.compile(GuidedParams(regex="a(b")))
    assert str(err).startswith("invalid guided regex: ") and "/" not in str(err).split(":")[0]
    assert (d.cache_misses, len(d.cache)) == (3, 2)  # a failed compile is neither counted nor cached


def test_the_step_counters_add_up_what_the_clock_says(dec, monkeypatch):
    d = dec
    d.reset_stats()
    assert d.stats() == dict(guided_cache_size=len(d.cache), guided_cache_hits=0, guided_cache_misses=0,
                             guided_steps=0, guided_mask_fill_s=0.0, guided_mask_wait_s=0.0,
                             guided_mask_apply_s=0.0)
    monkeypatch.setattr(guided_mod, "time", _Clock(1.0, 4.0, 10.0, 12.0, 20.0, 27.0, 30.0, 30.5))
    job = Future()
    job.set_result(("mask", 0.25))
    assert d.wait(job) == "mask"  # waited 3
    job = Future()
    job.set_result(("mask", 0.5))
    d.wait(job)  # waited 2
    g = d.matcher(GuidedParams(choice=["ab"]))
    bitmask, fill_s = d._fill([None, g])  # 20 -> 27
    assert fill_s == 7.0
    apply = d.mask_fn(bitmask, [0, 1])
    apply(torch.zeros(2, d.vocab_size))  # 30 -> 30.5
    s = d.stats()
    assert (s["guided_steps"], s["guided_mask_wait_s"], s["guided_mask_fill_s"], s["guided_mask_apply_s"]) == \
        (2, 5.0, 0.75, 0.5)
    d.reset_stats()
    assert (d.num_steps, d.fill_s, d.mask_wait_s, d.apply_s, d.cache_hits, d.cache_misses) == (0, 0, 0, 0, 0, 0)


def test_fill_masks_only_the_grammar_rows_wherever_they_stand(dec, bpe_tok):
    V = bpe_tok.vocab_size
    g = dec.matcher(GuidedParams(choice=["the lazy dog"]))
    j = dec.matcher(GuidedParams(json=SCHEMA))
    for t in bpe_tok.encode('{"name": "ab'):
        assert j.accept_token(t)
    bitmask = dec.wait(dec.start_masks([None, g, None, j]))
    assert bitmask.shape == (4, -(-V // 32)) and bitmask.dtype == torch.int32
    assert bool((bitmask[0] == -1).all()) and bool((bitmask[2] == -1).all())
    first = bpe_tok.encode("the lazy dog")[0]
    assert first in _allowed(bitmask[1], V) and len(_allowed(bitmask[1], V)) < V
    control = {i for i, b in enumerate(dec.info.decoded_vocab[:V]) if any(c < 0x20 for c in b)}
    raw = torch.full_like(bitmask[:1], -1)
    j.matcher.fill_next_token_bitmask(raw, 0)
    assert control & _allowed(raw[0], V)  # xgrammar lets them in here ...
    assert _allowed(bitmask[3], V) == _allowed(raw[0], V) - control  # ... the json row takes them out


def test_mask_fn_masks_the_given_logit_rows_and_no_other(dec, bpe_tok):
    V = bpe_tok.vocab_size
    spec = GuidedParams(choice=["the lazy dog"])
    bitmask = dec.wait(dec.start_masks([dec.matcher(spec) for _ in range(3)]))  # three restrictive rows
    logits = torch.zeros(3, V)
    dec.mask_fn(bitmask, [1])(logits)
    assert bool(torch.isfinite(logits[0]).all()) and bool(torch.isfinite(logits[2]).all())
    assert {int(i) for i in torch.isfinite(logits[1]).nonzero()} == _allowed(bitmask[1], V) != set(range(V))


def test_the_worker_is_one_named_thread_made_once_and_closed(bpe_tok):
    d = GuidedDecoder(bpe_tok, bpe_tok.vocab_size, bpe_tok.eos_id)
    g = d.matcher(GuidedParams(regex="a+"))
    names = []
    fill = d._fill
    d._fill = lambda gs: (names.append(__import__("threading").current_thread().name), fill(gs))[1]
    d.wait(d.start_masks([g]))
    worker = d._worker
    d.wait(d.start_masks([g]))
    assert d._worker is worker and worker._max_workers == 1
    assert names[0].startswith("moe-guided") and len(names) == 2
    d.close()
    assert d._worker is None and worker._shutdown
    d.close()  # twice: nothing to do


# ---------------------------------------------------------------------------- matchers and drafts
def test_without_an_eos_token_the_grammar_ends_by_itself(bpe_tok):
    spec = GuidedParams(choice=["the lazy dog"])
    for eos, ends in ((None, True), (bpe_tok.eos_id, False)):
        d = GuidedDecoder(bpe_tok, bpe_tok.vocab_size, eos)
        assert d.stop_ids == ([] if eos is None else [eos])
        g = d.matcher(spec)
        assert g.is_json is False
        assert all(g.accept_token(t) for t in bpe_tok.encode("the lazy dog"))
        assert g.is_terminated() is ends
    assert GuidedDecoder(bpe_tok, bpe_tok.vocab_size, bpe_tok.eos_id).matcher(GuidedParams(json_object=True)).is_json


def _row_masks(dec, spec, prefix_rows, V):
    out = []
    for prefix in prefix_rows:
        g = dec.matcher(spec)
        assert all(g.accept_token(t) for t in prefix)
        b = dec.xgr.allocate_token_bitmask(1, V)
        g.matcher.fill_next_token_bitmask(b, 0)
        out.append(_allowed(b[0], V))
    return out


def test_mask_drafts_masks_rows_up_to_the_last_draft_and_leaves_the_rest(dec, bpe_tok):
    V = bpe_tok.vocab_size
    spec = GuidedParams(choice=["the lazy dog", "the quick brown fox"])
    drafts = bpe_tok.encode("the lazy")
    g = dec.matcher(spec)
    logits = torch.zeros(len(drafts) + 3, V)  # more rows than drafts + 1
    dec.mask_drafts(g, drafts, logits)
    want = _row_masks(dec, spec, [drafts[:j] for j in range(len(drafts) + 1)], V)
    for j, w in enumerate(want):
        assert {int(i) for i in torch.isfinite(logits[j]).nonzero()} == w, j
    assert bool(torch.isfinite(logits[len(drafts) + 1:]).all())  # past the drafts: unmasked
    # rolled back exactly over the drafts it accepted: the next mask is the fresh matcher's
    b = dec.xgr.allocate_token_bitmask(1, V)
    g.matcher.fill_next_token_bitmask(b, 0)
    assert _allowed(b[0], V) == want[0]


def test_mask_drafts_with_no_drafts_masks_one_row_and_rolls_nothing_back(dec, bpe_tok):
    V = bpe_tok.vocab_size
    spec = GuidedParams(choice=["the lazy dog"])
    g = dec.matcher(spec)
    first = bpe_tok.encode("the lazy dog")[0]
    assert g.accept_token(first)
    logits = torch.zeros(2, V)
    dec.mask_drafts(g, [], logits)
    want = _row_masks(dec, spec, [[first]], V)[0]
    assert {int(i) for i in torch.isfinite(logits[0]).nonzero()} == want
    assert bool(torch.isfinite(logits[1]).all())
    b = dec.xgr.allocate_token_bitmask(1, V)
    g.matcher.fill_next_token_bitmask(b, 0)  # still after the one token it had accepted
    assert _allowed(b[0], V) == want


def test_mask_drafts_stops_at_the_grammars_end(bpe_tok):
    V = bpe_tok.vocab_size
    d = GuidedDecoder(bpe_tok, V, None)  # no eos: the grammar ends with the choice
    spec = GuidedParams(choice=["the lazy dog"])
    drafts = bpe_tok.encode("the lazy dog")
    g = d.matcher(spec)
    logits = torch.zeros(len(drafts) + 2, V)
    d.mask_drafts(g, drafts + [drafts[0]], logits)
    assert not bool(torch.isfinite(logits[len(drafts) - 1]).all())  # the last draft's row is masked
    assert bool(torch.isfinite(logits[len(drafts):]).all())  # after the end: unmasked
    assert not g.is_terminated() and all(g.accept_token(t) for t in drafts)  # rolled back to the start


def test_mask_drafts_of_a_json_row_takes_out_raw_control_characters(dec, bpe_tok):
    V = bpe_tok.vocab_size
    spec = GuidedParams(json=SCHEMA)
    g = dec.matcher(spec)
    for t in bpe_tok.encode('{"name": "ab'):
        assert g.accept_token(t)
    logits = torch.zeros(1, V)
    dec.mask_drafts(g, [], logits)
    raw = dec.xgr.allocate_token_bitmask(1, V)
    g.matcher.fill_next_token_bitmask(raw, 0)
    control = {i for i, b in enumerate(dec.info.decoded_vocab[:V]) if any(c < 0x20 for c in b)}
    assert control & _allowed(raw[0], V)
    assert {int(i) for i in torch.isfinite(logits[0]).nonzero()} == _allowed(raw[0], V) - control


# ---------------------------------------------------------------------------- what xgrammar is given
def test_without_xgrammar_a_guided_request_is_a_request_error(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "xgrammar", None)  # `import xgrammar` raises ImportError
    assert str(_error(guided_mod._xgrammar)) == ("structured outputs need xgrammar, which is not installed here "
                                                 "(pip install xgrammar, or the project's dev extra)")


def test_tokenizer_info_pads_and_cuts_to_the_model_vocabulary(bpe_tok):
    V = bpe_tok.vocab_size
    info = guided_mod.tokenizer_info(bpe_tok, V + 40, [bpe_tok.eos_id])
    assert info.decoded_vocab[V:] == [b""] * 40  # ids past the tokenizer's: no text
    assert info.add_prefix_space is False  # byte-level BPE without a prefix space
    short = guided_mod.tokenizer_info(bpe_tok, V - 7, [])  # a model vocabulary smaller than the tokenizer's
    assert len(short.decoded_vocab) == V - 7 and short.decoded_vocab == info.decoded_vocab[:V - 7]
    assert str(_error(lambda: guided_mod.tokenizer_info(object(), 10, []))) == (
        "structured outputs need the vocabulary of the tokenizer; object is neither moe.data.Tokenizer nor "
        "moe.hf.io.HFTokenizer")


def test_the_json_mask_takes_out_exactly_the_control_character_tokens(bpe_tok):
    V = -(-bpe_tok.vocab_size // 32) * 32 + 32  # a padded model vocabulary, a multiple of 32
    d = GuidedDecoder(bpe_tok, V, bpe_tok.eos_id)
    assert d.json_safe.shape == (V // 32,)
    control = {i for i, b in enumerate(d.info.decoded_vocab) if any(c < 0x20 for c in b)}
    assert control and any(b" " in b for b in d.info.decoded_vocab)  # both kinds of token exist here
    assert _allowed(d.json_safe, V) == set(range(V)) - control


def test_grammars_are_cached_by_the_decoder_only(dec):
    dec.compile(GuidedParams(regex="[0-9]+x"))
    assert dec.compiler.get_cache_size_bytes() == 0  # xgrammar's own (unbounded) cache is off


def _after(dec, spec, text, tok):
    g = dec.matcher(spec)
    assert all(g.accept_token(t) for t in tok.encode(text)), text
    b = dec.xgr.allocate_token_bitmask(1, dec.vocab_size)
    g.matcher.fill_next_token_bitmask(b, 0)
    return {dec.info.decoded_vocab[i] for i in _allowed(b[0], dec.vocab_size)}


def test_json_is_compact_and_schemas_are_strict(dec, bpe_tok):
    schema = GuidedParams(json={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    assert _after(dec, schema, "{", bpe_tok) == {b'"'}  # no whitespace
    assert _after(dec, schema, '{"a": 1', bpe_tok) == {b"}"} | {str(i).encode() for i in range(10)}  # no ","
    obj = GuidedParams(json_object=True)
    assert _after(dec, obj, "{", bpe_tok) == {b'"', b"}"}  # any property, no whitespace
    assert _after(dec, obj, '{"a": 1', bpe_tok) >= {b",", b"}"}
    assert b" " not in _after(dec, obj, '{"a": 1', bpe_tok)


def test_a_transformers_tokenizer_is_read_through_its_tok_attribute(bpe_tok, tmp_path):
    """Any object with a transformers tokenizer in `tok` (as moe.hf.io.HFTokenizer has): its vocabulary
    and xgrammar's detection of its encoding; no stop token is fine (the grammar ends by itself)."""
    from moe.hf.io import HFTokenizer
    hf = HFTokenizer.load(bpe_tok.save(tmp_path / "tok")).tok
    V = bpe_tok.vocab_size
    want = guided_mod.tokenizer_info(bpe_tok, V, [bpe_tok.eos_id]).decoded_vocab
    for stop in ([bpe_tok.eos_id], []):
        info = guided_mod.tokenizer_info(types.SimpleNamespace(tok=hf), V, stop)  # no `backend`, no special_ids
        assert info.decoded_vocab == want and info.vocab_type == guided_mod._xgrammar().VocabType.BYTE_LEVEL
        if stop:
            assert info.stop_token_ids == stop


def test_mask_drafts_masks_the_decoders_vocabulary_only(dec, bpe_tok):
    V = bpe_tok.vocab_size
    g = dec.matcher(GuidedParams(choice=["the lazy dog"]))
    logits = torch.zeros(1, V + 40)  # wider than the decoder's vocabulary
    dec.mask_drafts(g, [], logits)
    assert bool(torch.isfinite(logits[0, V:]).all())
    assert not bool(torch.isfinite(logits[0, :V]).all())


def test_a_non_special_added_token_keeps_its_text(bpe_tok):
    """moe.data.Tokenizer over a tokenizer.json with an added (not special) token: its text counts."""
    from tokenizers import Tokenizer as Raw

    from moe.data import Tokenizer
    raw = Raw.from_str(bpe_tok.backend.to_str())
    n = raw.get_vocab_size(with_added_tokens=True)
    raw.add_tokens(["<tool>"])
    tok = Tokenizer(raw)
    info = guided_mod.tokenizer_info(tok, tok.vocab_size, [tok.eos_id])
    assert tok.encode("<tool>") == [n] and info.decoded_vocab[n] == b"<tool>"


def test_the_hf_path_keeps_the_encoding_xgrammar_detects(bpe_tok, tmp_path, monkeypatch):
    """What xgrammar detects of a transformers tokenizer (here stubbed: a prefix-space RAW vocabulary,
    as a sentencepiece tokenizer has) is what the decoder's vocabulary is built with."""
    from moe.hf.io import HFTokenizer
    hf = HFTokenizer.load(bpe_tok.save(tmp_path / "tok")).tok
    xgr = guided_mod._xgrammar()
    calls = []

    def detect(tok, **kw):
        calls.append((tok, kw))
        return types.SimpleNamespace(vocab_type=xgr.VocabType.RAW, add_prefix_space=True)
    monkeypatch.setattr(xgr.TokenizerInfo, "from_huggingface", staticmethod(detect))
    info = guided_mod.tokenizer_info(types.SimpleNamespace(tok=hf), bpe_tok.vocab_size, [bpe_tok.eos_id])
    assert info.vocab_type == xgr.VocabType.RAW and info.add_prefix_space is True
    assert calls[0][0] is hf


@pytest.mark.parametrize("cpus, threads", [(None, 1), (1, 1), (3, 3), (16, 4)])
def test_xgrammar_gets_the_cpu_count_between_1_and_4_threads(bpe_tok, monkeypatch, cpus, threads):
    xgr = guided_mod._xgrammar()
    seen = {}
    real_compiler, real_batch = xgr.GrammarCompiler, xgr.BatchGrammarMatcher

    def compiler(info, **kw):
        seen["compiler"] = kw
        return real_compiler(info, **kw)

    def batch(n):
        seen["batch"] = n
        return real_batch(n)
    monkeypatch.setattr(guided_mod.os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(xgr, "GrammarCompiler", compiler)
    monkeypatch.setattr(xgr, "BatchGrammarMatcher", batch)
    GuidedDecoder(bpe_tok, bpe_tok.vocab_size, bpe_tok.eos_id)
    assert seen == {"compiler": {"max_threads": threads, "cache_enabled": False}, "batch": threads}
