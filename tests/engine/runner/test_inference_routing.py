"""The engine runs the model's inference routing (no router losses, no routing records) exactly when
nothing reads the records (`collect_routing_stats=False`), decided when the engine is built; the
tokens are the same either way."""

import pytest

import moe.moe_layer as moe_layer
from moe.engine import LLM, SamplingParams


@pytest.fixture
def record_calls(monkeypatch):
    """Counts the MoE layers' routing records (`make_record` calls)."""
    calls = [0]
    real = moe_layer.make_record

    def counted(*a):
        calls[0] += 1
        return real(*a)

    monkeypatch.setattr(moe_layer, "make_record", counted)
    return calls


def _generate(model, prompts, stats: bool, **kw):
    llm = LLM.from_model(model, max_num_seqs=3, block_size=8, num_blocks=64, collect_routing_stats=stats,
                         max_num_batched_tokens=24, enable_prefix_caching=False, **kw)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1))
    return llm, outs


def test_same_tokens_and_logprobs_without_records(model, make_prompts, record_calls):
    # three prompts, one longer than the token budget: chunked prefill, mixed prefill + decode steps, batch 3
    prompts = make_prompts([5, 30, 11], seed=4)
    full_llm, full = _generate(model, prompts, stats=True)
    with_records = record_calls[0]
    lean_llm, lean = _generate(model, prompts, stats=False)
    assert with_records > 0 and record_calls[0] == with_records  # none made without the statistics
    assert [o.token_ids for o in lean] == [o.token_ids for o in full]
    assert [o.logprobs for o in lean] == [o.logprobs for o in full]
    assert "moe/token_entropy" in full_llm.stats() and not any(k.startswith("moe/") for k in lean_llm.stats())


@pytest.mark.slow  # building a compiled runner imports torch's compiler stack (~7 s), as test_compiled.py
def test_compiled_engine_prefill_makes_no_records(model, make_prompts, record_calls):
    """The compiled runner's eager steps (a prefill, here the only step) take the same decision."""
    llm = LLM.from_model(model, compile=True, max_num_seqs=2, max_model_len=64, collect_routing_stats=False)
    out = llm.generate(make_prompts([7], seed=5), SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    assert len(out[0].token_ids) == 1 and llm.runner.num_compiled_steps == 0
    assert record_calls[0] == 0


def test_self_drafting_without_records(model, make_prompts, record_calls):
    """A draft pass (the served model with top_k 1) keeps its own default call; the verifying steps
    skip records: the tokens are the plain engine's."""
    prompts = make_prompts([9], seed=6)
    _, plain = _generate(model, prompts, stats=False)
    _, spec = _generate(model, prompts, stats=False, speculative={"method": "self", "num_tokens": 2, "top_k": 1})
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
