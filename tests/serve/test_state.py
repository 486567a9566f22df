"""`ServerState` without a running server: requests are checked by the engine's own
`validate_request`, and its RequestError becomes a 400 pointing at the request field the client
sent (`messages` for chat, `prompt` for completions), with OpenAI's `context_length_exceeded`."""

from __future__ import annotations

import copy

import pytest

from moe.engine import LLM
from moe.serve.protocol import APIError, ChatCompletionRequest, CompletionRequest
from moe.serve.state import ServerState
from tests.serve_fixtures import MODEL_NAME


@pytest.fixture(scope="module")
def state(tiny_model, tok):
    # 8 blocks of 16 = 128 cached tokens, context 512: the cache, not the context, limits a long request
    llm = LLM.from_model(copy.deepcopy(tiny_model), tok, num_blocks=8, collect_routing_stats=False)
    return ServerState(llm, MODEL_NAME, api_key="k", max_n=4)


@pytest.fixture(scope="module")
def roomy(tiny_model, tok):
    """A cache that holds a full-context sequence (as the engine sizes it by default)."""
    return ServerState(LLM.from_model(copy.deepcopy(tiny_model), tok, max_num_seqs=1, collect_routing_stats=False),
                       MODEL_NAME)


def completion(**kw) -> CompletionRequest:
    return CompletionRequest.model_validate({"prompt": "x", **kw})


def rejected(state, req, ids, max_tokens, field) -> APIError:
    with pytest.raises(APIError) as e:
        state.sampling_params(req, ids, max_tokens, None, [], prompt_field=field)
    assert e.value.status == 400 and e.value.type == "invalid_request_error"
    return e.value


def test_engine_errors_point_at_the_request_field(state):
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]})
    e = rejected(state, chat, [5] * 600, None, "messages")
    assert (e.param, e.code) == ("messages", "context_length_exceeded")
    assert "maximum context length is 512 tokens" in e.message and "600 tokens" in e.message
    e = rejected(state, completion(), [5] * 512, 4, "prompt")
    assert (e.param, e.code) == ("prompt", "context_length_exceeded")
    e = rejected(state, completion(), [], 4, "prompt")
    assert (e.param, e.code) == ("prompt", None) and "empty" in e.message
    e = rejected(state, completion(), [5, 10**6], 4, "prompt")
    assert e.param == "prompt" and "outside the vocabulary" in e.message
    e = rejected(state, completion(), [5] * 100, 100, "prompt")  # 199 tokens of cache > 128
    assert e.param == "max_tokens" and "KV blocks" in e.message and "lower max_tokens" in e.message
    e = rejected(state, completion(stop_token_ids=[-3]), [5] * 4, 4, "prompt")  # the engine's sampling check
    assert e.param == "stop_token_ids" and "non-negative" in e.message


def test_sampling_params_of_a_request(state, roomy, tok):
    end = tok.special_ids["<|end|>"]
    req = completion(n=3, seed=7, temperature=0.5, top_k=4, stop="zz")
    params = state.sampling_params(req, [5] * 10, 20, 2, [end], prompt_field="prompt")
    assert [p.seed for p in params] == [7, 8, 9]  # n choices differ, reproducibly
    assert all((p.temperature, p.top_k, p.max_tokens, p.stop, p.logprobs) == (0.5, 4, 20, ["zz"], 2) for p in params)
    assert params[0].stop_token_ids == [end]
    # None means all the context left after the prompt; more than that is a 400 naming the limit
    # (as the OpenAI API and vLLM answer), unless the server clips (--clip-max-tokens)
    assert roomy.sampling_params(completion(), [5] * 500, None, None, [], "prompt")[0].max_tokens == 12
    assert roomy.sampling_params(completion(), [5] * 500, 12, None, [], "prompt")[0].max_tokens == 12
    e = rejected(roomy, completion(), [5] * 500, 100, "prompt")
    assert (e.param, e.code) == ("max_tokens", "context_length_exceeded")
    assert e.message.startswith("This model's maximum context length is 512 tokens. However, you requested 600 "
                                "tokens (500 in the prompt, 100 in the completion); with this prompt, max_tokens can be at most 12")
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]})
    assert "(500 in the messages, 100 in the completion)" in rejected(roomy, chat, [5] * 500, 100, "messages").message
    clipping = ServerState(roomy.llm, MODEL_NAME, clip_max_tokens=True)
    assert clipping.sampling_params(completion(), [5] * 500, 100, None, [], "prompt")[0].max_tokens == 12
    # ignore_eos also drops the chat's end-of-turn stop id
    p = state.sampling_params(completion(ignore_eos=True), [5], 4, None, [end], "prompt")[0]
    assert p.stop_token_ids is None and p.ignore_eos


def test_model_auth_and_tokenizing(state, tok):
    state.check_model(None)
    state.check_model(MODEL_NAME)
    with pytest.raises(APIError, match="does not exist") as e:
        state.check_model("gpt-17")
    assert (e.value.param, e.value.code) == ("model", "model_not_found")
    assert state.encode("the lazy dog") == tok.encode("the lazy dog")
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "developer", "content": "x"}]})
    assert state.chat_ids(chat.messages) == tok.encode(tok.apply_chat_template([{"role": "system", "content": "x"}]))
    assert state.chat_stop_ids == [tok.special_ids["<|end|>"]]
    assert not state.driver.alive  # the driver thread starts with the app's lifespan, not here
