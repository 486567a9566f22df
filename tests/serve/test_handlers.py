"""The OpenAI-compatible server, driven by the real `openai` client over loopback: outputs equal
the engine's own (`LLM.generate`), streaming, concurrency, sampling options, errors, disconnects."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from moe.engine import SamplingParams
from tests.serve_fixtures import API_KEY, MODEL_NAME, read_metrics, wait_for

pytestmark = pytest.mark.timeout(120)

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the quick brown fox"}]


def greedy_ref(ref_llm, tok, prompt: str, max_tokens: int, chat: bool = True, **kw):
    stop_ids = [tok.special_ids["<|end|>"]] if chat else None
    return ref_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=max_tokens, stop_token_ids=stop_ids,
                                                   **kw))[0]


def test_health_and_models(client, http):
    assert http.get("/health").json() == {"status": "ok"}
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]


def test_chat_equals_generate(client, ref_llm, tok):
    ref = greedy_ref(ref_llm, tok, tok.apply_chat_template(MESSAGES), 16)
    assert ref.token_ids, "the reference generated nothing"
    r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=16, temperature=0)
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert c.message.content == ref.text
    assert c.finish_reason == ref.finish_reason
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert r.usage.completion_tokens == len(ref.token_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

    # streamed: the deltas add up to the same text; usage comes in a last, choice-less chunk
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == ref.text
    reasons = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert reasons == [ref.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ref.token_ids)
    assert all(ch.usage is None for ch in chunks[:-1])


def test_completions_options(client, ref_llm, tok):
    prompt = "once upon a time"
    ref = greedy_ref(ref_llm, tok, prompt, 12, chat=False, ignore_eos=True)
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].text == ref.text and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12  # max_tokens honoured

    # top_p so small that only the most likely token survives: sampling at temperature 1 is greedy
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=1.0, top_p=1e-6,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].text == ref.text

    # token-id prompts, batched with a text prompt
    ids = tok.encode(prompt)
    r = client.completions.create(model=MODEL_NAME, prompt=[ids, ids], max_tokens=12, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert [c.text for c in r.choices] == [ref.text, ref.text] and [c.index for c in r.choices] == [0, 1]

    # a stop string cuts the text before its first occurrence
    if len(ref.text) >= 4:
        stop = ref.text[2:4]
        r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0, stop=[stop],
                                      extra_body={"ignore_eos": True})
        assert r.choices[0].text == ref.text[:ref.text.find(stop)] and r.choices[0].finish_reason == "stop"

    # n choices with a seed: reproducible, and the choices differ from each other
    def sample():
        out = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=1.0, n=3,
                                        seed=123, extra_body={"ignore_eos": True})
        return [c.text for c in sorted(out.choices, key=lambda c: c.index)]
    a, b = sample(), sample()
    assert a == b and len(a) == 3 and len(set(a)) > 1

    # logprobs: one entry per generated token, the chosen one first when greedy
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=5, temperature=0, logprobs=2,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == r.choices[0].text
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert len(top) <= 2 and chosen <= 0 and abs(max(top.values()) - chosen) < 1e-5


def test_chat_logprobs_streamed_and_not(client):
    kw = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3,
              extra_body={"ignore_eos": True})
    r = client.chat.completions.create(**kw)
    content = r.choices[0].logprobs.content
    assert len(content) == 6 and all(len(t.top_logprobs) == 3 for t in content)
    streamed = [t for ch in client.chat.completions.create(stream=True, **kw) if ch.choices and ch.choices[0].logprobs
                for t in ch.choices[0].logprobs.content]
    assert [(t.token, round(t.logprob, 5)) for t in streamed] == [(t.token, round(t.logprob, 5)) for t in content]


def test_streamed_n_choices_with_usage(client):
    kw = dict(model=MODEL_NAME, prompt="the lazy dog", max_tokens=5, temperature=0.9, n=2, seed=5,
              extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    texts = ["", ""]
    for ch in chunks[:-1]:
        texts[ch.choices[0].index] += ch.choices[0].text
    assert texts == [c.text for c in sorted(whole.choices, key=lambda c: c.index)]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 10


def test_twenty_concurrent_streams(server, ref_llm, tok):
    prompts = [[{"role": "user", "content": f"story number {i}: the lazy dog"}] for i in range(20)]
    refs = ref_llm.generate([tok.apply_chat_template(m) for m in prompts],
                            SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[tok.special_ids["<|end|>"]]))

    async def one(client, messages):
        stream = await client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8,
                                                      temperature=0, stream=True)
        text, reason = "", None
        async for ch in stream:
            if ch.choices:
                text += ch.choices[0].delta.content or ""
                reason = ch.choices[0].finish_reason or reason
        return text, reason

    async def main():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0,
                                      timeout=60) as client:
            return await asyncio.wait_for(asyncio.gather(*(one(client, m) for m in prompts)), timeout=90)

    results = asyncio.run(main())
    assert [r[0] for r in results] == [o.text for o in refs]
    assert [r[1] for r in results] == [o.finish_reason for o in refs]


BAD = [
    ("malformed JSON", "/v1/chat/completions", b'{"messages": [', None),
    ("not an object", "/v1/chat/completions", b"[1, 2]", None),
    ("empty body", "/v1/chat/completions", b"", None),
    ("missing messages", "/v1/chat/completions", {"model": MODEL_NAME, "max_tokens": 4}, "messages"),
    ("empty messages", "/v1/chat/completions", {"messages": []}, "messages"),
    ("bad role", "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
    ("content not text", "/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}, None),
    ("negative max_tokens", "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": -5}, "max_tokens"),
    ("zero max_tokens", "/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("prompt longer than the context", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "the lazy dog " * 400}]}, "messages"),
    ("token ids beyond the context", "/v1/completions", {"prompt": [5] * 600}, "prompt"),
    ("token id outside the vocabulary", "/v1/completions", {"prompt": [5, 10**6]}, "prompt"),
    ("empty prompt", "/v1/completions", {"prompt": ""}, "prompt"),
    ("unknown model", "/v1/chat/completions", {"model": "gpt-17", "messages": MESSAGES}, "model"),
    ("temperature out of range", "/v1/completions", {"prompt": "hi", "temperature": -1}, "temperature"),
    ("top_p zero", "/v1/completions", {"prompt": "hi", "top_p": 0}, "top_p"),
    ("n too large", "/v1/completions", {"prompt": "hi", "n": 50}, "n"),
    ("unsupported penalty", "/v1/completions", {"prompt": "hi", "presence_penalty": 0.5}, "presence_penalty"),
    ("echo", "/v1/completions", {"prompt": "hi", "echo": True}, "echo"),
    # nested far past Python's recursion limit: refused before json.loads would recurse (was a 500)
    ("prompt nested 5,000 deep", "/v1/completions", b'{"prompt": ' + b"[" * 5000 + b"1" + b"]" * 5000 + b"}", None),
    ("content nested 5,000 deep", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": ' + b"[" * 5000 + b"]" * 5000 + b"}]}", None),
    ("nested 65 deep", "/v1/completions", b'{"prompt": ' + b"[" * 64 + b"]" * 64 + b"}", None),
]


@pytest.mark.parametrize("what,path,body,param", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_400(http, what, path, body, param):
    if isinstance(body, bytes):
        r = http.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if param is not None:
        assert err["param"] == param
    assert http.get("/health").status_code == 200


def test_bad_input_through_the_client_and_server_survives(client, http):
    with pytest.raises(openai.BadRequestError, match="does not exist"):
        client.chat.completions.create(model="nope", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "dog " * 2000}])
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=-1, stream=True)
    # the engine's check (validate_request) answers with OpenAI's code for a prompt that leaves no room
    err = http.post("/v1/completions", json={"prompt": [5] * 600}).json()["error"]
    assert (err["param"], err["code"]) == ("prompt", "context_length_exceeded")
    # other statuses, OpenAI-shaped too
    r = http.post("/v1/completions", content=b"x" * (65 * 1024), headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = httpx.post(http.base_url.join("/v1/completions"), json={"prompt": "hi"})  # no key
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(http.base_url.join("/v1/completions"), json={"prompt": "hi"},
                   headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert http.get("/v1/nothing").status_code == 404
    assert http.get("/v1/completions").status_code == 405
    # and the server still answers
    r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_stream_disconnect_frees_blocks(http):
    before = read_metrics(http)
    aborts0 = before['moe_serve_requests_finished_total{finish_reason="abort"}']
    body = {"messages": MESSAGES, "max_tokens": 480, "temperature": 0, "stream": True, "ignore_eos": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()  # (leaving a for loop over it would close the connection already)
        n = 0
        while n < 4:
            line = next(lines)
            n += line.startswith("data: ") and '"content"' in line
        running = read_metrics(http)
        assert running["moe_serve_kv_blocks_used"] > 0 and running["moe_serve_num_requests_running"] == 1
    # the connection is closed: the request is aborted and its blocks freed at once (next step)
    def freed():
        m = read_metrics(http)
        return m if m["moe_serve_kv_blocks_used"] == 0 and m["moe_serve_num_requests_running"] == 0 and \
            m['moe_serve_requests_finished_total{finish_reason="abort"}'] == aborts0 + 1 else None
    m = wait_for(freed, timeout=10)
    assert m, f"KV blocks were not freed after the client disconnected: {read_metrics(http)}"
    assert m["moe_serve_num_requests_pending"] == 0


def test_non_streamed_disconnect_aborts(server, http):
    aborts0 = read_metrics(http)['moe_serve_requests_finished_total{finish_reason="abort"}']
    body = {"messages": MESSAGES, "max_tokens": 480, "temperature": 0, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(30, read=0.3),
                   headers={"Authorization": f"Bearer {API_KEY}"})
    m = wait_for(lambda: (lambda m: m if m['moe_serve_requests_finished_total{finish_reason="abort"}'] > aborts0
                          and m["moe_serve_kv_blocks_used"] == 0 else None)(read_metrics(http)), timeout=10)
    assert m, "the abandoned request was not aborted"


def test_metrics_and_tokenize(http, tok):
    r = http.post("/tokenize", json={"messages": MESSAGES})
    assert r.json()["tokens"] == tok.encode(tok.apply_chat_template(MESSAGES))
    assert r.json()["max_model_len"] == 512
    text = http.get("/metrics").text
    for name in ["moe_serve_num_requests_running", "moe_serve_num_requests_waiting", "moe_serve_kv_cache_usage_ratio",
                 "moe_serve_prefix_cache_hit_rate", "moe_serve_generation_tokens_per_second",
                 "moe_serve_time_to_first_token_seconds_bucket", "moe_serve_inter_token_latency_seconds_count"]:
        assert name in text
    m = read_metrics(http)
    assert m["moe_serve_time_to_first_token_seconds_count"] > 0
    ttft_count = m["moe_serve_time_to_first_token_seconds_count"]
    assert m['moe_serve_time_to_first_token_seconds_bucket{le="+Inf"}'] == ttft_count
    assert m['moe_serve_http_responses_total{endpoint="chat_completions",status="200"}'] > 0
    json.dumps(m)  # plain numbers


def test_a_client_leaving_mid_body_is_a_499_not_a_server_error(server, http):
    """A client that closes its connection before its body is complete is counted as 499 (client
    closed request), not 5xx: the soak test's 'early' disconnects must not read as server errors."""
    import socket
    from urllib.parse import urlsplit

    def chat_count(status: int) -> float:
        return read_metrics(http).get(f'moe_serve_http_responses_total{{endpoint="chat_completions",status="{status}"}}', 0)

    before499, before500 = chat_count(499), chat_count(500)
    u = urlsplit(server.url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: 1000\r\n\r\n{\"messages\": [")
    assert wait_for(lambda: chat_count(499) == before499 + 1, timeout=10), read_metrics(http)
    assert chat_count(500) == before500
