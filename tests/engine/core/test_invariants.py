"""The engine's debug invariants (moe/engine/core/invariants.py): each test plants one realistic bug
of the scheduler or the block manager and shows the hook raises at the step that breaks it, and
a busy workload (chunked prefill, prefix hits, preemption, aborts) runs clean with the checks on.
Several planted bugs leave the generated tokens right, which is why the invariants exist."""

import pytest

from moe.engine import LLM, EngineConfig, SamplingParams
from moe.engine.memory import block_manager as bm_module
from moe.engine.core import invariants
from moe.engine.core.invariants import InvariantError

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def run_all(llm, steps: int = 200) -> int:
    n = 0
    while llm.has_unfinished_requests() and n < steps:
        llm.step()
        n += 1
    return n


def test_flag_reads_the_environment(monkeypatch):
    monkeypatch.setenv("MOE_CHECK_INVARIANTS", "0")
    assert EngineConfig().check_invariants is False
    monkeypatch.setenv("MOE_CHECK_INVARIANTS", "1")
    assert EngineConfig().check_invariants is True
    assert EngineConfig(check_invariants=False).check_invariants is False


def test_busy_workload_runs_clean_and_is_checked_every_step(model, make_prompts, monkeypatch):
    calls = []
    real = invariants.check_invariants
    monkeypatch.setattr(invariants, "check_invariants", lambda eng: (calls.append(1), real(eng)))
    shared = make_prompts([40], seed=3)[0]
    prompts = [shared + t for t in make_prompts([3, 20, 1], seed=4)] + make_prompts([33, 17], seed=5)
    llm = LLM.from_model(model, None, num_blocks=8, max_num_batched_tokens=24, max_num_seqs=3,
                         check_invariants=True)
    rids = [llm.add_request(p, GREEDY) for p in prompts]
    llm.step()
    llm.abort_request(rids[-1])  # an abort mid-prefill returns its blocks too
    steps = 1 + run_all(llm)
    assert len(calls) == steps and steps > 5
    assert llm.stats()["num_preemptions"] > 0 and llm.stats()["prefix_cache_hits"] > 0


def test_prefill_chunk_one_token_over_budget_is_caught(model, make_prompts, naive):
    """Budget 10, prompt of 30: chunks 10, 11, 9 (planted: the second step reads a budget one too
    large). The tokens stay right, so outputs cannot tell; the hook raises at the 11-token step."""
    prompt = make_prompts([30], seed=6)[0]
    for check in (False, True):
        llm = LLM.from_model(model, None, max_num_batched_tokens=10, check_invariants=check)
        seq = llm.requests[llm.add_request(prompt, GREEDY)]
        chunks, done = [], []
        for budget in (10, 11, 10):
            llm.scheduler.max_num_batched_tokens = budget
            before = seq.num_computed_tokens
            if check and budget == 11:
                with pytest.raises(InvariantError, match=r"11 tokens \[11\] over max_num_batched_tokens=10"):
                    llm.step()
                break
            llm.step()
            chunks.append(seq.num_computed_tokens - before)
        if not check:
            assert chunks == [10, 11, 9]
            while llm.has_unfinished_requests():
                done += [e.output for e in llm.step() if e.finished]
            assert done[0].token_ids == naive(model, prompt, GREEDY.max_tokens)


def test_too_many_sequences_is_caught(model, make_prompts):
    llm = LLM.from_model(model, None, max_num_seqs=2, check_invariants=True)
    llm.scheduler.max_num_seqs = 3  # planted: the scheduler reads a limit one too large
    for p in make_prompts([5, 6, 7]):
        llm.add_request(p, GREEDY)
    with pytest.raises(InvariantError, match="max_num_seqs=2"):
        llm.step()


def test_leaked_block_of_a_finished_request_is_caught(model, make_prompts):
    llm = LLM.from_model(model, None, check_invariants=True)
    bm = llm.block_manager

    def free_all_but_first(seq):  # planted: the release loop skips the head block
        for bid in reversed(seq.block_table[1:]):
            bm._release(bid)
        seq.block_table, seq.block_hashes = [], []

    bm.free = free_all_but_first
    llm.add_request(make_prompts([20])[0], SamplingParams(temperature=0, max_tokens=1))
    with pytest.raises(InvariantError, match="ref_count 1 but 0 block-table uses"):
        run_all(llm)


def test_aborted_request_that_keeps_its_blocks_is_caught(model, make_prompts):
    llm = LLM.from_model(model, None, check_invariants=True)
    sched = llm.scheduler

    def remove_without_free(seq):  # planted: dequeued, blocks never returned
        sched.running.remove(seq) if seq in sched.running else sched.waiting.remove(seq)

    sched.remove = remove_without_free
    rid = llm.add_request(make_prompts([20])[0], GREEDY)
    llm.step()
    llm.abort_request(rid)
    with pytest.raises(InvariantError, match="still holds blocks|block-table uses"):
        llm.step()


def test_block_both_free_and_used_is_caught(model, make_prompts):
    llm = LLM.from_model(model, None, check_invariants=True)
    bm = llm.block_manager
    real_take = bm._take_block

    def take_but_keep_listed():  # planted: the block is handed out but stays on the free list
        bid = real_take()
        bm.free_ids.append(bid)
        return bid

    bm._take_block = take_but_keep_listed
    llm.add_request(make_prompts([20])[0], GREEDY)
    with pytest.raises(InvariantError, match="both free and used"):
        llm.step()


def test_unchained_prefix_hash_is_caught(model, make_prompts, monkeypatch):
    """Planted: blocks hashed on their own tokens, not chained to their parent's hash (so a prompt
    starting with another's second block would hit K/V computed after another parent, at other
    positions). The hook re-hashes from the sequence start and raises when the second block of
    the first prompt is registered."""
    x, y, tail = make_prompts([16, 16, 5], seed=7)
    real = bm_module.hash_block
    monkeypatch.setattr(bm_module, "hash_block", lambda parent, toks: real(None, toks))
    llm = LLM.from_model(model, None, check_invariants=True)
    llm.add_request(x + y + tail, GREEDY)
    with pytest.raises(InvariantError, match="block 1's recorded hash is not the chained hash"):
        run_all(llm)
