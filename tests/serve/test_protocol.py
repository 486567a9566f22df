"""Structured outputs through the server: OpenAI's `response_format` (json_object, json_schema,
the client's pydantic `parse` helper) and the vLLM-style `guided_*` fields on both endpoints,
streamed and not; a bad schema, regex or grammar is a 400 naming the field it came in."""

from __future__ import annotations

import json
import re
from typing import Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field

from tests.serve_fixtures import MODEL_NAME

pytestmark = pytest.mark.timeout(120)

SCHEMA = {"type": "object", "properties": {
    "answer": {"enum": ["yes", "no"]},
    "score": {"type": "integer", "minimum": 1, "maximum": 5},
    "ok": {"type": "boolean"}}, "required": ["answer", "score", "ok"], "additionalProperties": False}
MSG = [{"role": "user", "content": "Is the fox quick? Answer in JSON."}]


class Verdict(BaseModel):
    answer: Literal["yes", "no"]
    score: int = Field(ge=1, le=5)
    tags: list[Literal["quick", "lazy"]] = Field(max_length=2)


def test_pydantic_parse_helper(client):
    """`client.chat.completions.parse(response_format=Model)` (the OpenAI SDK's structured-output
    helper: it sends a strict json_schema and parses the reply into the model)."""
    for seed in range(2):
        r = client.chat.completions.parse(model=MODEL_NAME, messages=MSG, response_format=Verdict, temperature=1.0,
                                          seed=seed, max_tokens=64)
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "stop"
        assert isinstance(msg.parsed, Verdict), msg.content
        assert Verdict.model_validate_json(msg.content) == msg.parsed


def test_response_format_json_schema_and_json_object(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=MSG, temperature=1.0, seed=1, max_tokens=64, n=2,
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "verdict", "schema": SCHEMA, "strict": True}})
    for c in r.choices:
        jsonschema.validate(json.loads(c.message.content), SCHEMA)
    # json_object: any JSON object. This untrained model writes long random strings, so some
    # choices run out of tokens (their text is then a cut JSON object); those that stop parse.
    r = client.chat.completions.create(model=MODEL_NAME, messages=MSG, temperature=1.0, seed=0, max_tokens=48, n=4,
                                       response_format={"type": "json_object"})
    stopped = [c for c in r.choices if c.finish_reason == "stop"]
    assert stopped and all(c.message.content.startswith("{") for c in r.choices)
    assert all(isinstance(json.loads(c.message.content), dict) for c in stopped)


def test_guided_fields_on_both_endpoints_streamed_and_not(client):
    pattern = r"[0-9]{3}-[a-z]{2,4}"
    for stream in (False, True):
        r = client.completions.create(model=MODEL_NAME, prompt="the fox", max_tokens=20, temperature=1.0, seed=3,
                                      stream=stream, extra_body={"guided_regex": pattern})
        text = "".join(c.choices[0].text for c in r if c.choices) if stream else r.choices[0].text
        assert re.fullmatch(pattern, text), text
        r = client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=20, temperature=1.0, seed=4,
                                           stream=stream, extra_body={"guided_choice": ["quick fox", "lazy dog"]})
        text = "".join(c.choices[0].delta.content or "" for c in r if c.choices) if stream else \
            r.choices[0].message.content
        assert text in ("quick fox", "lazy dog")
    r = client.completions.create(model=MODEL_NAME, prompt="the fox", max_tokens=64, temperature=1.0, seed=5,
                                  extra_body={"guided_json": json.dumps(SCHEMA)})
    jsonschema.validate(json.loads(r.choices[0].text), SCHEMA)
    r = client.completions.create(model=MODEL_NAME, prompt="the fox", max_tokens=20, temperature=1.0, seed=6,
                                  extra_body={"guided_grammar": 'root ::= ("red" | "green") " " [0-9]'})
    assert re.fullmatch(r"(red|green) [0-9]", r.choices[0].text)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "x", "guided_json": {"type": "objectx"}}, "guided_json"),
    ("/v1/completions", {"prompt": "x", "guided_json": "{not json"}, "guided_json"),
    ("/v1/completions", {"prompt": "x", "guided_regex": "a(b"}, "guided_regex"),
    ("/v1/completions", {"prompt": "x", "guided_grammar": "root ::= undefined_rule"}, "guided_grammar"),
    ("/v1/completions", {"prompt": "x", "guided_choice": []}, "guided_choice"),
    ("/v1/completions", {"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "objectx"}}}}, "response_format"),
    ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": "json_schema"}},
     "response_format.json_schema"),
    ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": "yaml"}}, "response_format.type"),
    ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": "json_object"}, "guided_regex": "a"},
     "guided_regex"),
])
def test_bad_structure_is_a_400_naming_the_field(http, path, body, param):
    r = http.post(path, json={"model": MODEL_NAME, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err


def test_text_response_format_is_unconstrained(client, ref_llm):
    """`{"type": "text"}` asks for nothing: the greedy answer is the engine's own."""
    from moe.engine import SamplingParams
    r = client.chat.completions.create(model=MODEL_NAME, messages=MSG, temperature=0, max_tokens=12,
                                       response_format={"type": "text"})
    end = ref_llm.tokenizer.special_ids["<|end|>"]
    ref = ref_llm.chat(MSG, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[end]))[0]
    assert r.choices[0].message.content == ref.text
