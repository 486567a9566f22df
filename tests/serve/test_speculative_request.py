"""`speculative` per HTTP request (moe-lab's extension field): a method on a server started without
--speculative, "off", and a bad value as a 400 naming the field. Greedy text equals the plain engine's."""

from __future__ import annotations

import pytest

from moe.engine import SamplingParams
from tests.serve_fixtures import MODEL_NAME, read_metrics

PROMPT = "the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog. the quick"


def _proposed(http) -> float:
    return read_metrics(http).get("moe_serve_spec_proposed_total", 0.0)


def test_a_request_chooses_its_own_speculative_decoding(client, http, ref_llm):
    (want,) = ref_llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    answers = {}
    for spec in ("ngram", "off", {"method": "ngram", "num_tokens": 2}, None):
        before = _proposed(http)
        extra = {"ignore_eos": True} | ({} if spec is None else {"speculative": spec})
        r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0, extra_body=extra)
        answers[str(spec)] = (r.choices[0].text, _proposed(http) - before)
    for spec, (text, proposed) in answers.items():
        assert text == want.text, spec  # speculation never changes a greedy answer
    assert answers["ngram"][1] > 0 and answers[str({"method": "ngram", "num_tokens": 2})][1] > 0
    assert answers["off"][1] == 0 and answers["None"][1] == 0  # this server's default: no speculation


@pytest.mark.parametrize("spec, words", [("bogus", ["bogus"]), ({"method": "draft"}, ["draft", "draft model"]),
                                         ({"method": "ngram", "model": "x"}, ["draft model"])])
def test_a_speculative_method_the_server_cannot_run_is_a_400_naming_the_field(http, spec, words):
    r = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2, "speculative": spec})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "speculative" and all(w in err["message"] for w in words), err
