"""`SpeculativeConfig` and where it is given (`LLM(speculative=...)`, `SamplingParams(speculative=...)`):
bad values are errors naming the field and the allowed values, at construction or per request."""

import pytest

from moe.engine import LLM, SamplingParams
from moe.engine.config import SpeculativeConfig
from moe.errors import ConfigError, RequestError


@pytest.mark.parametrize("value,words", [
    ("medusa", ["speculative.method='medusa' is unknown", "['ngram', 'draft', 'self', 'mtp']", "'off'"]),
    ({"method": "ngram", "num_tokens": 0}, ["speculative.num_tokens=0", "positive int"]),
    ({"method": "ngram", "prompt_lookup_min": 5}, ["prompt_lookup_min=5", "<= prompt_lookup_max=4"]),
    ({"method": "self", "top_k": 0}, ["speculative.top_k=0"]),
    ({"method": "self", "skip_layers": ["a"]}, ["speculative.skip_layers"]),
    ({"method": "ngram", "model": "x"}, ["takes none"]),
    ({"num_tokens": 3}, ["needs a 'method'"]),
    ({"method": "ngram", "k": 3}, ["unknown speculative option(s) ['k']", "num_tokens"]),
    (3, ["method name", "got int"]),
])
def test_bad_configs_name_the_field(value, words):
    with pytest.raises(ConfigError) as e:
        SpeculativeConfig.coerce(value)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_off_only_per_request():
    assert SamplingParams(speculative="off").speculative == "off"
    with pytest.raises(ConfigError, match="unknown"):
        SpeculativeConfig.coerce("off")
    assert SamplingParams(speculative={"method": "self", "skip_layers": 1}).speculative.skip_layers == (1,)


def test_request_errors_name_the_param():
    with pytest.raises(RequestError) as e:
        SamplingParams(speculative="medusa")
    assert e.value.param == "speculative" and "['ngram', 'draft', 'self', 'mtp']" in str(e.value)
    with pytest.raises(RequestError, match="engine option"):
        SamplingParams(speculative={"method": "draft", "model": "runs/x"})


def test_engine_checks(model):
    with pytest.raises(ConfigError, match="needs speculative.model"):
        LLM.from_model(model, None, speculative="draft")
    with pytest.raises(ConfigError, match="cheaper drafting pass"):
        LLM.from_model(model, None, speculative={"method": "self", "top_k": None})
    with pytest.raises(ConfigError, match="some, not all"):
        LLM.from_model(model, None, speculative={"method": "self", "skip_layers": [0, 1]})
    with pytest.raises(ConfigError, match="<= the model's router top_k=2"):
        LLM.from_model(model, None, speculative={"method": "self", "top_k": 3})
    llm = LLM.from_model(model, None, collect_routing_stats=False)
    with pytest.raises(RequestError) as e:
        llm.validate_request([5, 6], {"speculative": "draft"})
    assert e.value.param == "speculative" and "has none" in str(e.value)
    with pytest.raises(RequestError) as e:
        llm.validate_request([5, 6], {"speculative": {"method": "self", "top_k": 2}})
    assert e.value.param == "speculative" and "cheaper" in str(e.value)
    # a guided request speculates too (its drafts are verified under the grammar's masks)
    assert llm.spec.resolve(SamplingParams(speculative="ngram", guided={"choice": ["a", "b"]})).method == "ngram"
    out = llm.generate([5, 6], SamplingParams(speculative="draft"))[0]  # add_request: an error output
    assert out.finish_reason == "error" and "draft" in out.error
