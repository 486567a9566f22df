import pytest

from moe.engine.core.scheduler import Scheduler
from moe.engine.memory.block_manager import BlockManager, hash_block
from moe.engine.sampling.sampler import SamplingParams
from moe.engine.sequence import Sequence, SequenceStatus


def make_seq(ids, rid="r"):
    return Sequence(rid, None, list(ids), SamplingParams(), arrival_time=0.0)


def run_prefill(bm, seq):
    """Admit `seq` with its prefix hits, allocate the rest, mark it computed, register blocks."""
    hits = bm.match_prefix(seq)
    assert bm.can_admit(hits, seq.num_tokens)
    bm.admit(seq, hits)
    assert bm.allocate_slots(seq, seq.num_tokens - seq.num_computed_tokens)
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_full_blocks(seq)
    return hits


def test_allocate_free_and_counts():
    bm = BlockManager(num_blocks=6, block_size=4, enable_prefix_caching=False)
    s = make_seq(range(10))
    assert bm.allocate_slots(s, 10) and len(s.block_table) == 3
    assert bm.num_used_blocks == 3 and bm.num_free_blocks == 3
    s.num_computed_tokens = 10
    assert bm.allocate_slots(s, 2) and len(s.block_table) == 3  # 12 tokens still fit in 3 blocks
    assert bm.allocate_slots(s, 3) and len(s.block_table) == 4
    t = make_seq(range(20), "t")
    assert not bm.allocate_slots(t, 9)  # needs 3, 2 free: nothing allocated
    assert t.block_table == [] and bm.num_free_blocks == 2
    bm.free(s)
    assert bm.num_free_blocks == 6 and s.block_table == []
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_chained_hash_depends_on_parent():
    a = hash_block(None, [1, 2, 3, 4])
    assert hash_block(a, [5, 6, 7, 8]) != hash_block(hash_block(None, [0, 2, 3, 4]), [5, 6, 7, 8])
    assert hash_block(a, [5, 6, 7, 8]) == hash_block(hash_block(None, [1, 2, 3, 4]), [5, 6, 7, 8])


def test_prefix_hits_share_blocks_and_count():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = make_seq(list(range(10)) + [99], "a")  # 2 full blocks + 3 tokens
    assert run_prefill(bm, a) == []
    b = make_seq(list(range(8)) + [50, 51, 52, 53, 54], "b")  # shares the 2 full blocks
    hits = run_prefill(bm, b)
    assert hits == a.block_table[:2]
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert [bm.blocks[i].ref_count for i in hits] == [2, 2]
    assert bm.prefix_queries == 11 + 13 and bm.prefix_hits == 8
    assert bm.hit_rate == pytest.approx(8 / 24)
    # a different first block breaks the chain even if the second block's tokens match
    c = make_seq([7] + list(range(1, 8)) + [1], "c")
    assert bm.match_prefix(c) == []


def test_match_leaves_one_token_to_compute():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make_seq(range(8), "a")
    run_prefill(bm, a)
    same = make_seq(range(8), "b")  # fully cached: the last block must be recomputed
    assert bm.match_prefix(same) == a.block_table[:1]
    longer = make_seq(range(9), "c")
    assert bm.match_prefix(longer) == a.block_table[:2]


def test_freed_blocks_stay_hittable_then_evict_lru_tail_first():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = make_seq([1, 2, 3, 4, 5], "a")  # blocks: [1,2] [3,4] [5]
    run_prefill(bm, a)
    table = list(a.block_table)
    bm.free(a)
    assert bm.num_free_blocks == 4
    # the unhashed partial block went back to the free list, the full ones are evictable (tail first)
    assert list(bm.evictable) == [table[1], table[0]]
    b = make_seq([1, 2, 3, 4, 6], "b")
    assert bm.match_prefix(b) == table[:2]
    # allocating 3 blocks: 2 truly free ones first, then the least recently released cached block
    c = make_seq([9] * 6, "c")
    assert bm.allocate_slots(c, 6)
    assert bm.evictions == 1 and table[1] in c.block_table
    assert bm.match_prefix(b) == table[:1]  # [3,4] was evicted, [1,2] survives


def test_duplicate_blocks_computed_in_one_step_are_not_double_registered():
    bm = BlockManager(num_blocks=8, block_size=2)
    a, b = make_seq([1, 2, 3], "a"), make_seq([1, 2, 4], "b")
    for s in (a, b):  # both admitted before either registered (same step)
        bm.admit(s, bm.match_prefix(s))
        bm.allocate_slots(s, 3)
    for s in (a, b):
        s.num_computed_tokens = 3
        bm.cache_full_blocks(s)
    assert len(bm.hash_to_block) == 1 and bm.hash_to_block[a.block_hashes[0]] == a.block_table[0]
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 8


def test_reset_prefix_cache():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = make_seq([1, 2, 3, 4, 5], "a")
    run_prefill(bm, a)
    bm.free(a)
    bm.reset_prefix_cache()
    assert not bm.hash_to_block and not bm.evictable and bm.num_free_blocks == 4
    assert bm.match_prefix(make_seq([1, 2, 3, 4, 5])) == []


def test_a_kept_prefix_match_is_dropped_after_every_reset_and_eviction():
    """A waiting sequence keeps its last prefix match until the cache loses a hash; every reset or
    eviction must invalidate it, in any order. Rules out an epoch that a reset sets to a constant
    (a second reset would look like none) or moves backwards (an eviction after it would restore
    the old epoch), either of which hands out blocks that now hold other tokens."""
    def cached(bm, ids, rid):
        s = make_seq(ids, rid)
        run_prefill(bm, s)
        bm.free(s)

    # reset, match, reset again: the second reset must invalidate the match made after the first
    bm = BlockManager(num_blocks=4, block_size=2)
    bm.reset_prefix_cache()
    cached(bm, [1, 2, 3, 4, 5], "a")
    w = make_seq([1, 2, 3, 4, 5], "w")
    assert len(bm.match_prefix(w)) == 2
    bm.reset_prefix_cache()
    assert bm.match_prefix(w) == []
    # match, reset, one eviction: the eviction after the reset must not make the old match current
    bm = BlockManager(num_blocks=4, block_size=2)
    cached(bm, [1, 2, 3, 4, 5], "a")
    w = make_seq([1, 2, 3, 4, 5], "w")
    assert len(bm.match_prefix(w)) == 2
    bm.reset_prefix_cache()
    cached(bm, [7, 8, 9, 10, 11], "b")  # 3 blocks, 2 registered
    evictions = bm.evictions
    cached(bm, [20, 21, 22, 23, 24, 25], "c")  # 3 blocks: the last free one, then one eviction
    assert bm.evictions == evictions + 1
    assert bm.match_prefix(w) == []  # none of w's tokens is cached now


def test_scheduler_budget_chunking_and_max_num_seqs():
    bm = BlockManager(num_blocks=64, block_size=4)
    sch = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=10)
    seqs = [make_seq(range(7 + i), f"s{i}") for i in range(3)]
    for s in seqs:
        sch.add(s)
    b = sch.schedule()
    assert [s.request_id for s in b.seqs] == ["s0", "s1"] and b.num_new_tokens == [7, 3]  # s1 chunked
    assert b.num_decodes == 0 and len(sch.running) == 2  # max_num_seqs keeps s2 waiting
    for s, n in zip(b.seqs, b.num_new_tokens):
        s.num_computed_tokens += n
    seqs[0].token_ids.append(5)  # s0 sampled a token; s1 is mid-prefill
    b = sch.schedule()
    assert [s.request_id for s in b.seqs] == ["s0", "s1"] and b.num_new_tokens == [1, 5]
    assert b.num_decodes == 1


def test_scheduler_preempts_newest_and_resumes_first():
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=False)
    sch = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=100)
    a, b = make_seq([1, 2, 3], "a"), make_seq([4, 5, 6], "b")
    sch.add(a)
    sch.add(b)
    batch = sch.schedule()
    assert len(batch.seqs) == 2 and bm.num_free_blocks == 0
    for s in (a, b):
        s.num_computed_tokens = 3
        s.token_ids.append(7)
    # a needs no new block for token 4; b neither; after one more token both need one
    batch = sch.schedule()
    for s in (a, b):
        s.num_computed_tokens += 1
        s.token_ids.append(8)
    batch = sch.schedule()
    assert [s.request_id for s in batch.seqs] == ["a"] and batch.preempted == [b]
    assert b.num_computed_tokens == 0 and b.block_table == [] and sch.waiting[0] is b
    assert b.metrics.num_preemptions == 1 and sch.num_preemptions == 1
    sch.remove(a)  # a finishes: b is resumed with all its 5 tokens
    batch = sch.schedule()
    assert batch.seqs == [b] and batch.num_new_tokens == [5]


def test_after_a_reset_blocks_are_reusable_and_cache_again():
    """The blocks a reset frees can be allocated (each one, once), and prefix caching works again
    afterwards: a released block goes back to the free list, not the evictable one, until it is
    registered anew (mutants: a reset that frees None, or leaves "" as the hash)."""
    bm = BlockManager(num_blocks=4, block_size=2)
    a = make_seq([1, 2, 3, 4, 5], "a")
    run_prefill(bm, a)
    bm.free(a)
    bm.reset_prefix_cache()
    b = make_seq([7, 8, 9, 10, 11, 12, 13, 14], "b")
    assert bm.allocate_slots(b, 8) and sorted(b.block_table) == [0, 1, 2, 3]
    bm.free(b)  # never registered: all four go back to the free list
    assert len(bm.free_ids) == 4 and not bm.evictable
    c = make_seq([1, 2, 3, 4, 5], "c")
    run_prefill(bm, c)
    bm.free(c)
    assert len(bm.evictable) == 2 and len(bm.match_prefix(make_seq([1, 2, 3, 4, 9]))) == 2


def test_trim_releases_the_tail_blocks_only():
    """Speculative decoding's rollback: blocks beyond those `num_tokens` need are released tail
    first (to the free list if never hashed, the evictable one if hashed; a block shared with
    another sequence only loses a reference); the kept blocks and their hashes stay."""
    bm = BlockManager(num_blocks=8, block_size=2)
    a = make_seq([1, 2, 3, 4], "a")
    run_prefill(bm, a)  # blocks A0 [1, 2], A1 [3, 4], hashed
    s = make_seq([1, 2, 3, 4, 5, 6, 7], "s")
    assert run_prefill(bm, s) == a.block_table  # s = [A0, A1, B [5, 6] (hashed), C [7]]
    a0, a1, b, c = s.block_table
    bm.trim(s, 5)  # 5 tokens need 3 blocks: C goes back to the free list
    assert s.block_table == [a0, a1, b] and c in bm.free_ids and bm.blocks[c].ref_count == 0
    bm.trim(s, 3)  # B was hashed: evictable (still hittable), and its hash leaves s
    assert s.block_table == [a0, a1] and b in bm.evictable and len(s.block_hashes) == 2
    bm.trim(s, 2)  # A1 is shared with a: one reference less, neither free nor evictable
    assert s.block_table == [a0] and bm.blocks[a1].ref_count == 1
    assert a1 not in bm.free_ids and a1 not in bm.evictable and bm.blocks[a0].ref_count == 2
    bm.free(a)
    assert a1 in bm.evictable and bm.blocks[a0].ref_count == 1


def test_bad_sizes_admit_and_eviction_count():
    """The constructor's own check (each bound, its message), admit's precondition, and the
    eviction counter counting every eviction (not just whether one happened)."""
    for n, bs in ((0, 4), (4, 0)):
        with pytest.raises(ValueError, match=f"num_blocks={n} and block_size={bs} must be >= 1"):
            BlockManager(n, bs)
    assert BlockManager(1, 1).num_free_blocks == 1  # the smallest valid cache
    bm = BlockManager(num_blocks=2, block_size=2)
    a = make_seq([1, 2, 3, 4, 5], "a")
    with pytest.raises(AssertionError, match="^admit\\(\\) expects a sequence without blocks$"):
        a.block_table = [0]
        bm.admit(a, [])
    a.block_table = []
    b = make_seq([1, 2, 3], "b")
    run_prefill(bm, b)  # [1, 2] hashed, [3] not
    bm.free(b)
    c = make_seq([5, 6, 7, 8], "c")
    run_prefill(bm, c)  # needs both blocks: evicts [1, 2]
    bm.free(c)  # both hashed now
    d = make_seq([9, 10, 11, 12], "d")
    run_prefill(bm, d)  # evicts both of c's
    assert bm.evictions == 3


def test_block_hashes_follow_the_tokens_after_a_rollback():
    """The per-sequence hash memo is cut back to the tokens that still exist when it is next read:
    the engine only hashes final tokens today, but after a rollback (a future speculative mode)
    the new tokens must be hashed, not the old hashes reused. (A rollback that regrows to the same
    length before any read is not detected: `_token_hash`'s docstring says so.)"""
    bm = BlockManager(num_blocks=8, block_size=2, enable_prefix_caching=True)
    seq = make_seq([1, 2, 3, 4, 5, 6])
    assert bm._token_hash(seq, 2) == hash_block(hash_block(hash_block(None, [1, 2]), [3, 4]), [5, 6])
    del seq.token_ids[3:]  # back to [1, 2, 3]: one full block
    assert bm._token_hash(seq, 0) == hash_block(None, [1, 2]) and len(seq.token_hashes) == 1
    seq.token_ids += [9, 8, 7]
    assert bm._token_hash(seq, 2) == hash_block(hash_block(hash_block(None, [1, 2]), [3, 9]), [8, 7])
