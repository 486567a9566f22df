"""The scheduler (moe/engine/core/scheduler.py): bounds, queues, batch accounting, decode-first order,
preemption, and the token budget, each pinned by a mutant that survived mutation testing
(docs/guides/testing.md). The engine-level checks are in test_invariants.py and test_engine.py."""

import pytest

from moe.engine.core.scheduler import Scheduler
from moe.engine.memory.block_manager import BlockManager
from moe.engine.sampling.sampler import SamplingParams
from moe.engine.sequence import Sequence, SequenceStatus


def make_seq(ids, rid="r"):
    return Sequence(rid, None, list(ids), SamplingParams(), arrival_time=0.0)


def test_scheduler_bounds_queues_and_batch_accounting():
    """The constructor's bounds (each one, its message), `remove`/`find`/`has_unfinished` over both
    queues, and the batch's token count, truthiness and decode count (mutation testing, issue 13)."""
    for s, t in ((0, 1), (1, 0)):  # either bound alone below 1 is refused; 1 and 1 is the smallest
        with pytest.raises(ValueError, match=f"^max_num_seqs={s} and max_num_batched_tokens={t} must be >= 1$"):
            Scheduler(BlockManager(4, 2), s, t)
    bm = BlockManager(num_blocks=8, block_size=2)
    sch = Scheduler(bm, max_num_seqs=1, max_num_batched_tokens=1)
    assert not sch.has_unfinished() and sch.find("a") is None
    a, b = make_seq([1, 2, 3], "a"), make_seq([4, 5], "b")
    sch.add(a)
    sch.add(b)
    batch = sch.schedule()  # budget 1: a single one-token prefill chunk is a "decode" in the split
    assert batch and batch.seqs == [a] and batch.num_tokens == 1 and batch.num_decodes == 1
    assert sch.find("a") is a and sch.find("b") is b and sch.find("c") is None
    sch.remove(b)  # a waiting sequence leaves the waiting queue (it holds no blocks)
    assert list(sch.waiting) == [] and sch.running == [a] and sch.has_unfinished()
    sch.remove(a)  # a running one releases its block
    assert sch.running == [] and bm.num_free_blocks == 8 and not sch.has_unfinished()
    assert not sch.schedule() and sch.schedule().num_tokens == 0


def test_scheduler_decodes_first_and_counts_every_preemption():
    """Decodes (1 new token) go before prefill chunks whatever the arrival order, and the
    preemption counters count every preemption (not just whether one happened); a resumed
    sequence keeps the cached-prompt count of its first admission."""
    bm = BlockManager(num_blocks=64, block_size=4)
    sch = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=100)
    a, b = make_seq(range(5), "a"), make_seq(range(10, 12), "b")
    sch.add(a)
    batch = sch.schedule()
    a.num_computed_tokens = 5
    a.token_ids.append(9)
    sch.add(b)
    batch = sch.schedule()  # b (2-token prefill) arrives after a's decode: a first anyway
    assert batch.seqs == [a, b] and batch.num_new_tokens == [1, 2] and batch.num_decodes == 1
    c = make_seq(range(5), "c")  # the same 4-token first block as a: a prefix-cache hit
    bm.cache_full_blocks(a)
    sch.add(c)
    assert c.status is SequenceStatus.WAITING
    batch = sch.schedule()
    assert c.status is SequenceStatus.RUNNING
    assert batch.seqs == [a, c, b] and batch.num_new_tokens == [1, 1, 2] and batch.num_decodes == 2
    assert c.metrics.num_cached_prompt_tokens == 4
    sch.running.remove(c)  # as schedule() does: pop the victim, then preempt it
    sch._preempt(c)
    bm.reset_prefix_cache()  # c is resumed with no hit: its first admission's count stands
    sch.schedule()
    assert c.metrics.num_cached_prompt_tokens == 4 and c in sch.running
    sch.running.remove(c)
    sch._preempt(c)  # a preempted sequence is waiting again (the engine reports it as not running)
    assert c.status is SequenceStatus.WAITING and sch.waiting[0] is c
    assert c.metrics.num_preemptions == 2 and sch.num_preemptions == 2


def test_running_sequences_stop_exactly_when_the_budget_is_spent():
    """Running sequences are served while budget is left: the last token of the budget is used
    (not `budget > 1`) and a sequence is not listed with 0 new tokens (not `budget >= 0`)."""
    bm = BlockManager(num_blocks=8, block_size=2)
    sch = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=3)
    seqs = [make_seq([i], f"s{i}") for i in range(3)]
    for s in seqs:
        sch.add(s)
    assert sch.schedule().num_new_tokens == [1, 1, 1]
    for s in seqs:
        s.num_computed_tokens = 1
        s.token_ids.append(7)
    sch.max_num_batched_tokens = 2  # three decodes, two tokens of budget
    batch = sch.schedule()
    assert batch.seqs == seqs[:2] and batch.num_new_tokens == [1, 1]


def test_a_sequence_too_big_for_the_whole_cache_fails_alone_instead_of_looping():
    """The last resort (requests are checked on arrival, so this needs a sequence grown past the
    cache): alone and still unable to get blocks, it is failed and its blocks released; it is not
    preempted (it would wait forever), and the batch is still returned (nothing else scheduled)."""
    bm = BlockManager(num_blocks=2, block_size=2, enable_prefix_caching=False)
    sch = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=16)
    s = make_seq([1, 2, 3], "big")
    sch.add(s)
    assert sch.schedule().seqs == [s]
    s.num_computed_tokens = 3
    s.token_ids += [4, 5]  # 5 tokens need 3 blocks: more than the cache has
    batch = sch.schedule()
    assert batch is not None and batch.failed == [s] and batch.preempted == [] and batch.seqs == []
    assert s.block_table == [] and bm.num_free_blocks == 2 and not sch.running and not sch.waiting
    assert s.metrics.num_preemptions == 0
