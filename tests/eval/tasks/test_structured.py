"""task=structured: the scoring (parsing, field recall, both directions), the stored items (valid
schemas, type-correct expected values, keywords xgrammar enforces), a run on the tiny trained
checkpoint with and without constrained decoding, and what that run relies on: on this trained
model, many random JSON schemas from a small generator, sampled at temperature > 0 in one batch
with regex and choice requests, all end with the grammar, parse and validate; regex and choice
outputs match."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
import torch

from eval.tasks.structured import DATA, cap_strings, field_recall, parse_answer, score
from moe.engine import LLM, SamplingParams
from tests.eval.conftest import compose

ITEMS = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]


def test_parse_answer():
    assert parse_answer(' {"a": 1}\n') == {"a": 1}
    assert parse_answer('Sure! Here it is: {"a": [1, 2]} Hope that helps.') == {"a": [1, 2]}
    assert parse_answer("[1, 2]") == [1, 2]
    for bad in ("", "no json here", '{"a": 1', '{"a": }', "} {"):
        assert parse_answer(bad) is None, bad


def test_field_recall_counts_each_expected_value_once():
    expected = {"name": "Tim", "age": 3, "likes": ["balls", "naps"], "pet": {"kind": "dog", "ok": True}}
    assert field_recall(expected, expected) == 1.0
    assert field_recall(expected, {"name": " tim ", "age": 3.0, "likes": ["naps", "balls"],
                                   "pet": {"kind": "DOG", "ok": True}}) == 1.0  # case, spaces, order, 3 == 3.0
    assert field_recall(expected, {"name": "Tim", "likes": ["balls", "balls"], "pet": {"ok": 1}}) == 2 / 6
    assert field_recall(expected, {"name": "Tom", "age": "3", "kind": "dog", "extra": "naps"}) == 0.0  # wrong place
    assert field_recall(expected, None) == 0.0
    assert field_recall({"m": None, "b": False}, {"m": None, "b": 0}) == 0.5  # False is not 0, None is None


def test_score_parses_validates_and_recalls():
    item = {"schema": {"type": "object", "properties": {"n": {"type": "integer", "maximum": 5}}, "required": ["n"]},
            "expected": {"n": 4}}
    assert score(item, '{"n": 4}') == {"parsed": 1.0, "valid": 1.0, "field_recall": 1.0}
    assert score(item, '{"n": 9}') == {"parsed": 1.0, "valid": 0.0, "field_recall": 0.0}
    assert score(item, '{"n": 4') == {"parsed": 0.0, "valid": 0.0, "field_recall": 0.0}


def test_cap_strings_bounds_only_free_text():
    schema = {"type": "object", "properties": {
        "a": {"type": "string"}, "b": {"type": "string", "maxLength": 3}, "c": {"enum": ["x"]},
        "d": {"type": "string", "pattern": "^x$"}, "e": {"type": ["string", "null"]},
        "f": {"type": "array", "items": {"type": "object", "properties": {"g": {"type": "string"}}}},
        "h": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}
    capped = cap_strings(schema, 8)
    p = capped["properties"]
    assert p["a"]["maxLength"] == p["e"]["maxLength"] == p["f"]["items"]["properties"]["g"]["maxLength"] == 8
    assert p["h"]["anyOf"][0]["maxLength"] == 8 and "maxLength" not in p["h"]["anyOf"][1]
    assert p["b"]["maxLength"] == 3 and "maxLength" not in p["c"] and "maxLength" not in p["d"]
    assert "maxLength" not in schema["properties"]["a"]  # the original is untouched


def _without_required(schema):
    if isinstance(schema, dict):
        return {k: _without_required(v) for k, v in schema.items() if k != "required"}
    if isinstance(schema, list):
        return [_without_required(v) for v in schema]
    return schema


def test_the_stored_items():
    assert len(ITEMS) >= 30 and len({it["id"] for it in ITEMS}) == len(ITEMS)
    assert {it["category"] for it in ITEMS} == {"fields", "nested", "ranges", "enums"}
    for it in ITEMS:
        jsonschema.Draft202012Validator.check_schema(it["schema"])
        # `expected` holds the values the instruction gives: type-correct, possibly not every field
        jsonschema.validate(it["expected"], _without_required(it["schema"]))
        assert it["expected"] and it["instruction"] and it["source"]
        assert "uniqueItems" not in json.dumps(it["schema"])  # xgrammar does not enforce it
    complete = [it for it in ITEMS if jsonschema.Draft202012Validator(it["schema"]).is_valid(it["expected"])]
    assert len(complete) >= 25


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:max_model_len=")  # schema prompts run past the tiny model's 128 positions
def test_run_with_and_without_constraints(tmp_path, tiny_run, one_thread):
    """The 8-step checkpoint writes no JSON by itself; under the grammar (free-text strings
    capped, so a greedy loop inside quotes still ends) every answer parses and validates."""
    from eval.__main__ import run_eval

    ids = [i for i, it in enumerate(ITEMS) if it["id"] in ("geo", "language", "time_of_day")]
    res = run_eval(compose("structured", f"ckpt={tiny_run}", "logger=none", f"eval.question_ids={ids}",
                           "eval.max_new_tokens=40", "eval.max_string_length=6"), tmp_path / "run")
    c, u = res["modes"]["constrained"], res["modes"]["unconstrained"]
    assert res["num_items"] == 3 and c["parse_rate"] == c["valid_rate"] == 1.0 and c["finish_reasons"] == {"stop": 3}
    assert u["parse_rate"] == 0.0 and set(c["by_category"]) == {"ranges", "enums"}
    rows = [json.loads(line) for line in (tmp_path / "run" / "answers.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and {r["mode"] for r in rows} == {"constrained", "unconstrained"}
    for r in rows:
        if r["mode"] == "constrained":
            schema = next(it["schema"] for it in ITEMS if it["id"] == r["id"])
            jsonschema.validate(json.loads(r["answer"]), schema)
    assert json.loads((tmp_path / "run" / "results.json").read_text())["modes"]["constrained"]["valid_rate"] == 1.0


@pytest.mark.parametrize("override, message", [
    ("eval.modes=[constrained,strict]", r"eval.modes\[\]='strict' is not allowed; choose one of \['unconstrained', "
                                        r"'constrained'\]"),
    ("eval.modes=[]", "eval.modes=.* must be a non-empty list"),
    ("eval.max_string_length=0", "eval.max_string_length=0 must be > 0"),
    ("eval.temperature=-1", "eval.temperature=-1.0 must be >= 0"),
    ("eval.max_new_tokens=0", "eval.max_new_tokens=0 must be > 0"),
])
def test_config_fields_are_checked(override, message):
    from eval.config import load_eval_config
    from moe.errors import ConfigError

    assert load_eval_config(compose("structured", "ckpt=x")).eval.modes == ["unconstrained", "constrained"]
    with pytest.raises(ConfigError, match=message):
        load_eval_config(compose("structured", "ckpt=x", override))


@pytest.fixture
def one_thread():
    """A tiny model: intra-op threads only add sync overhead (and spin on shared cores)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


WORDS = ["red", "green", "blue", "dog", "cat", "sun", "ball", "tree", "a b", 'say "hi"', "日本"]


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """An object schema of bounded size: every value has a bounded spelling (strings have a
    maxLength, an enum or a pattern; numbers a range; arrays maxItems), so a sample always ends."""
    def value(d: int) -> dict:
        kinds = ["enum", "string", "integer", "number", "boolean", "null_or_string", "array", "pattern", "const"]
        if d < 1:
            kinds.append("object")
        kind = rng.choice(kinds)
        if kind == "enum":
            return {"enum": rng.sample(WORDS, rng.randint(1, 4))}
        if kind == "string":
            lo = rng.randint(0, 2)
            return {"type": "string", "minLength": lo, "maxLength": lo + rng.randint(0, 6)}
        if kind == "integer":
            lo = rng.randint(-1000, 1000)
            return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 5000)}
        if kind == "number":
            lo = rng.uniform(-100, 100)
            return {"type": "number", "minimum": round(lo, 2), "maximum": round(lo + rng.uniform(0.5, 100), 2)}
        if kind == "boolean":
            return {"type": "boolean"}
        if kind == "null_or_string":
            return {"type": ["string", "null"], "maxLength": 4}
        if kind == "array":
            item = rng.choice([{"type": "boolean"}, {"enum": rng.sample(WORDS, 2)},
                               {"type": "integer", "minimum": 0, "maximum": 99}])
            lo = rng.randint(0, 2)
            return {"type": "array", "items": item, "minItems": lo, "maxItems": lo + rng.randint(0, 2)}
        if kind == "pattern":
            return {"type": "string", "pattern": rng.choice(["^[a-c]{1,3}$", "^[0-9]{2}-[A-Z]$", "^(yes|no)$"])}
        if kind == "const":
            return {"const": rng.choice(WORDS)}
        return random_schema(rng, d + 1)

    n = rng.randint(1, 3 if depth == 0 else 2)
    props = {f"{rng.choice(['id', 'name', 'x', 'tag', 'val'])}_{i}": value(depth) for i in range(n)}
    required = [k for k in props if rng.random() < 0.7]
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:max_model_len=400 exceeds the model's context")  # room for long answers; positions past 128 are fine here
def test_random_schemas_regexes_and_choices_on_a_trained_model(tiny, one_thread):
    model, tokenizer, _ = tiny
    rng = random.Random(0)
    schemas = [random_schema(rng) for _ in range(32)]
    regexes = [r"[0-9]{3}-[a-z]{2,4}", r"(the|a) (dog|cat) (ran|sat)\.", r"[A-Z][a-z]{0,6}!"]
    choices = [["Tim", "Lily", "the little dog"], ["yes", "no"]]
    llm = LLM.from_model(model, tokenizer, max_model_len=400, allow_long_context=True, seed=0,
                         collect_routing_stats=False)
    prompt = tokenizer.encode("Once upon a time, there was a little girl. She")
    params = [SamplingParams(temperature=0.9, seed=i, max_tokens=320, guided={"json": s}) for i, s in enumerate(schemas)]
    params += [SamplingParams(temperature=1.0, seed=i, max_tokens=40, guided={"regex": r})
               for i, r in enumerate(regexes * 2)]
    params += [SamplingParams(temperature=1.0, seed=i, max_tokens=40, guided={"choice": c})
               for i, c in enumerate(choices * 3)]
    outs = llm.generate([prompt] * len(params), params)
    for o, p in zip(outs, params):
        assert o.finish_reason == "stop" and o.token_ids[-1] == tokenizer.eos_id, (p.guided, o.text)
    for o, s in zip(outs, schemas):
        jsonschema.validate(json.loads(o.text), s)
    for o, p in zip(outs[len(schemas):], params[len(schemas):]):
        g = p.guided
        assert (re.fullmatch(g.regex, o.text) if g.regex else o.text in g.choice), (g, o.text)
    assert len({o.text for o in outs[:len(schemas)]}) > 0.8 * len(schemas)  # sampled answers, not one template
    assert llm.stats()["guided_cache_misses"] == len(schemas) + len(regexes) + len(choices)
