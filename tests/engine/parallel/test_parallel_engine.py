"""The tensor-parallel engine (real processes, gloo, 2 ranks) against the single-process engine
on the same checkpoint: greedy tokens equal, logprobs within fp32 tolerance, with mixed prompt
lengths, chunked prefill, prefix caching and preemption in one run; TP experts and EP experts.

Each layout's engine is spawned once for the module (spawning a rank costs seconds: it imports
torch and loads the checkpoint); the last test kills a rank of the EP engine, so it stays last."""

import multiprocessing as mp

import pytest
import torch

from moe.engine import LLM, SamplingParams
from moe.errors import ConfigError
from tests.engine.conftest import build_model, random_prompts
from tests.engine.parallel.conftest import VOCAB

LENGTHS = [1, 5, 16, 17, 33, 47]
# a small cache (preemption), small chunks (chunked prefill), prefix caching on (the default)
OPTS = dict(device="cpu", block_size=8, num_blocks=10, max_num_batched_tokens=16, max_num_seqs=4)
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1)


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(LENGTHS, vocab=VOCAB)


@pytest.fixture(scope="module")
def reference(checkpoint, prompts):
    llm = LLM(checkpoint, **OPTS)
    first = llm.generate(prompts, PARAMS)
    return first, llm.generate(prompts, PARAMS), llm.stats()


@pytest.fixture(scope="module")
def tp_engine(checkpoint):
    llm = LLM(checkpoint, tensor_parallel_size=2, **OPTS)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def ep_engine(checkpoint):
    """(Its rank 1 is killed by the last test of the module.)"""
    llm = LLM(checkpoint, tensor_parallel_size=2, expert_parallel=True, **OPTS)
    yield llm
    llm.shutdown()


def assert_same(outs, refs):
    for o, r in zip(outs, refs):
        assert o.error is None, o.error
        assert o.token_ids == r.token_ids
        got = torch.tensor([lp[t] for lp, t in zip(o.logprobs, o.token_ids)])
        want = torch.tensor([lp[t] for lp, t in zip(r.logprobs, r.token_ids)])
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("engine", ["tp_engine", "ep_engine"])
def test_outputs_equal_the_single_process_engine(engine, request, reference, prompts):
    parallel = request.getfixturevalue(engine)
    ref_first, ref_again, ref_stats = reference
    assert_same(parallel.generate(prompts, PARAMS), ref_first)
    assert_same(parallel.generate(prompts, PARAMS), ref_again)  # the second pass hits the prefix cache
    stats = parallel.stats()
    assert stats["num_preemptions"] > 0 and stats["prefix_cache_hits"] > 0  # the features did run
    assert stats["num_preemptions"] == ref_stats["num_preemptions"]
    assert stats["prefix_cache_hits"] == ref_stats["prefix_cache_hits"]


def test_speculative_requests_are_refused(tp_engine, prompts):
    out = tp_engine.generate(prompts[:1], SamplingParams(max_tokens=3, speculative="ngram"))[0]
    assert out.finish_reason == "error" and "tensor_parallel_size" in out.error


@pytest.mark.parametrize("opts, named", [
    (dict(tensor_parallel_size=3), "model.n_heads=4"),  # 4 heads over 3 ranks
    (dict(tensor_parallel_size=4), "model.n_kv_heads=2"),
    (dict(tensor_parallel_size=2, compile=True), "compile=True"),
    (dict(tensor_parallel_size=2, speculative="ngram"), "speculative='ngram'"),
    (dict(tensor_parallel_size=2, kv_cache_dtype="fp8_e4m3"), "kv_cache_dtype"),
    (dict(tensor_parallel_size=2, quantization="int8"), "quantization='int8'"),
    (dict(tensor_parallel_size=0), "tensor_parallel_size=0"),
])
def test_bad_layouts_fail_before_any_process_starts(checkpoint, opts, named):
    running = set(mp.active_children())  # (a module-scoped engine's worker may still be up)
    with pytest.raises(ConfigError, match="tensor_parallel_size") as e:
        LLM(checkpoint, **opts, device="cpu")
    assert named in str(e.value)
    assert set(mp.active_children()) <= running


def test_more_ranks_than_experts_and_from_model_are_refused():
    from moe.engine.parallel.layout import check_layout
    cfg = build_model(VOCAB, n_heads=8, n_kv_heads=8).cfg  # 4 experts
    with pytest.raises(ConfigError, match=r"model.n_experts=4 .*more ranks than experts"):
        check_layout(cfg, 8, expert_parallel=True)
    with pytest.raises(ConfigError, match="LLM.from_model"):
        LLM.from_model(build_model(VOCAB), tensor_parallel_size=2)


def test_a_dead_rank_fails_the_step_with_a_clear_error(ep_engine, prompts):
    llm = ep_engine  # the module's last use of it
    (worker,) = llm._workers.procs
    worker.kill()
    worker.join(timeout=10)
    out = llm.generate(prompts[:2], SamplingParams(max_tokens=3))
    assert all(o.finish_reason == "error" and "tensor-parallel rank 1" in o.error for o in out)
    again = llm.generate(prompts[:1], SamplingParams(max_tokens=3))[0]  # and every later step, at once
    assert again.finish_reason == "error" and "tensor-parallel rank 1" in again.error
