"""`LLMEngine`: the one request validation (`validate_request`: RequestError with `param` and
`code`), bad requests that fail alone, the add_request / step / abort API, and the engine used
directly with an `EngineConfig`."""

import pytest

from moe.engine import LLM, EngineConfig, LLMEngine, SamplingParams
from moe.errors import RequestError

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


# ---------------------------------------------------------------------------- validate_request

@pytest.fixture
def engine(model, tokenizer_cls):
    # 4 blocks of 16 tokens = 64 cached tokens; max_model_len 100 (so the cache, not the context, limits)
    return LLMEngine(model, tokenizer_cls(), EngineConfig(num_blocks=4, max_model_len=100,
                                                          collect_routing_stats=False))


VALIDATE = [  # (prompt ids, params, param, code, words in the message)
    ([], None, "prompt", None, ["empty"]),
    ([5, 300, 9999], None, "prompt", None, ["[300, 9999]", "outside the vocabulary [0, 260)"]),
    ([5, True], None, "prompt", None, ["[True]"]),
    ([5] * 100, None, "prompt", "context_length_exceeded", ["maximum context length is 100", "max_model_len",
                                                            "prompt has 100 tokens", "at most 99"]),
    ([5] * 40, SamplingParams(max_tokens=30), "max_tokens", None, ["5 KV blocks", "69 tokens", "only 4",
                                                                   "lower max_tokens"]),
    ([5] * 4, {"temperature": -1.0}, "temperature", None, ["SamplingParams.temperature=-1.0", ">= 0"]),
    ([5] * 4, {"top_k": -3}, "top_k", None, ["top_k"]),
    ([5] * 4, {"max_tokens": 0}, "max_tokens", None, [">= 1"]),
    ([5] * 4, {"tempature": 0.5}, None, None, ["unknown SamplingParams field(s) ['tempature']", "temperature"]),
]


@pytest.mark.parametrize("ids,params,param,code,words", VALIDATE,
                         ids=["empty", "vocabulary", "bool id", "too long", "kv cache", "temperature", "top_k",
                              "max_tokens", "unknown field"])
def test_validate_request_names_the_param(engine, ids, params, param, code, words):
    with pytest.raises(RequestError) as e:
        engine.validate_request(ids, params)
    assert (e.value.param, e.value.code) == (param, code)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_validate_request_accepts_what_fits(engine):
    # 40 + 25 - 1 = 64 cached tokens: exactly the 4 blocks
    assert engine.validate_request([5] * 40, {"max_tokens": 25}).max_tokens == 25
    # max_model_len caps what is cached: 99 prompt tokens + any max_tokens = 99 cached > 64 ...
    with pytest.raises(RequestError, match="KV blocks"):
        engine.validate_request([5] * 99, None)
    # ... while a short prompt with a huge max_tokens is capped by max_model_len too (99 tokens)
    with pytest.raises(RequestError, match="7 KV blocks"):
        engine.validate_request([5], {"max_tokens": 10**6})
    assert engine.validate_request([5] * 4) == SamplingParams()


def test_add_request_turns_validation_errors_into_error_outputs(engine):
    rid = engine.add_request([5] * 100, GREEDY)
    assert engine.has_unfinished_requests() and not engine.is_idle()
    (ev,) = engine.step()
    assert ev.request_id == rid and ev.finished and ev.finish_reason == "error"
    assert "maximum context length" in ev.output.error
    assert not engine.has_unfinished_requests() and engine.is_idle()
    with pytest.raises(RequestError, match="tokenizer"):
        LLMEngine(engine.model, None, EngineConfig(num_blocks=4)).encode("text")


def test_failed_and_dropped_requests(engine):
    bad = engine.add_failed_request("bad chat messages: nope", prompt="", index=3)
    live = engine.add_request([7] * 5, GREEDY)
    engine.drop_request(live)  # gone without a trace: never reported, its blocks are free
    events = engine.step()
    assert [(e.request_id, e.index, e.finish_reason, e.output.error) for e in events] == \
        [(bad, 3, "error", "bad chat messages: nope")]
    assert engine.is_idle() and not engine.has_unfinished_requests()
    assert engine.stats()["kv_blocks_used"] == 0 and engine.step() == []


# ---------------------------------------------------------------------------- bad requests (moved from test_llm.py)

def test_bad_requests_fail_alone(model, naive, make_prompts, tokenizer_cls):
    llm = LLM.from_model(model, tokenizer_cls(), max_model_len=64)
    good = make_prompts([6, 11], seed=10)
    prompts = [good[0], "", list(range(70)), [5, 9999], good[1], "x", "y"]
    params = [GREEDY, GREEDY, GREEDY, GREEDY, GREEDY, {"temperature": -1.0}, {"tempature": 0.5}]
    outs = llm.generate(prompts, params)
    assert [o.finish_reason for o in outs] == ["length", "error", "error", "error", "length", "error", "error"]
    assert "empty" in outs[1].error and "max_model_len" in outs[2].error and "vocabulary" in outs[3].error
    assert "temperature" in outs[5].error and "tempature" in outs[6].error
    assert outs[0].token_ids == naive(model, good[0], 12) and outs[4].token_ids == naive(model, good[1], 12)
    assert llm.stats()["kv_blocks_used"] == 0


def test_request_too_big_for_the_cache_fails_alone(model, make_prompts):
    llm = LLM.from_model(model, None, num_blocks=3)  # 48 slots
    outs = llm.generate(make_prompts([40, 5]), SamplingParams(temperature=0, max_tokens=20))
    assert outs[0].finish_reason == "error" and "KV blocks" in outs[0].error
    assert outs[1].finish_reason == "length"


def test_model_failure_fails_the_step_not_the_engine(model, make_prompts):
    llm = LLM.from_model(model, None)
    boom = {"on": True}

    def hook(_mod, _args):
        if boom["on"]:
            raise RuntimeError("boom")
    h = model.layers[0].register_forward_pre_hook(hook)
    try:
        out = llm.generate(make_prompts([5]), GREEDY)[0]
    finally:
        h.remove()
    assert out.finish_reason == "error" and "boom" in out.error
    assert llm.generate(make_prompts([5]), GREEDY)[0].finish_reason == "length"


# ---------------------------------------------------------------------------- serving API (moved from test_llm.py)

def test_add_request_step_abort(model, naive, make_prompts):
    llm = LLM.from_model(model, None)
    a, b = make_prompts([8, 12], seed=11)
    ra = llm.add_request(a, GREEDY)
    rb = llm.add_request(b, GREEDY, request_id="mine")
    assert rb == "mine"
    with pytest.raises(ValueError, match="in use"):
        llm.add_request(b, GREEDY, request_id="mine")
    events = llm.step()
    assert {e.request_id for e in events} == {ra, rb} and all(len(e.token_ids) == 1 for e in events)
    assert llm.abort_request(rb) and not llm.abort_request("unknown")
    tokens = {ra: [], rb: []}
    finished = {}
    while llm.has_unfinished_requests():
        for e in llm.step():
            tokens[e.request_id] += e.token_ids
            if e.finished:
                finished[e.request_id] = e.output
    assert finished[rb].finish_reason == "abort" and finished[ra].finish_reason == "length"
    assert finished[ra].token_ids == naive(model, a, 12)
    assert llm.stats()["kv_blocks_used"] == 0
