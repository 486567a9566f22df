"""moe/engine/memory/free_list.py and the block manager's allocation order: a new sequence gets
consecutive ascending ids wherever the free ids allow, a growing one its next id, after any order of
frees and resets; the set of free blocks (and so what is evicted) is what it was."""

from moe.engine.memory.block_manager import BlockManager
from moe.engine.memory.free_list import FreeBlockIds
from moe.engine.sampling.sampler import SamplingParams
from moe.engine.sequence import Sequence


def make_seq(ids, rid="r"):
    return Sequence(rid, None, list(ids), SamplingParams(), arrival_time=0.0)


def grow(bm, seq, n):
    """Decode `n` tokens one at a time (as the engine does: allocate, compute, append)."""
    for _ in range(n):
        assert bm.allocate_slots(seq, 1)
        seq.num_computed_tokens = seq.num_tokens
        seq.token_ids.append(7)


def test_free_ids_pop_lowest_take_any_and_list_each_once():
    f = FreeBlockIds([5, 1, 3])
    f.append(0)
    assert f.take(3) and not f.take(3) and not f.take(9)
    assert list(f) == [0, 1, 5] and len(f) == 3 and 5 in f and 3 not in f
    assert [f.popleft(), f.popleft()] == [0, 1]
    f.append(3)
    assert f.popleft() == 3 and f.popleft() == 5 and not f
    for i in range(200):  # many takes: the lazily deleted heap entries are dropped, not kept for ever
        f.append(i)
        f.take(i)
    assert len(f) == 0 and len(f._heap) <= 64 + 1


def test_a_sequence_after_freed_ones_gets_consecutive_blocks():
    """Blocks freed tail first and moved to the free list by a reset (the batch-1 benchmark's
    order, which a FIFO list handed out descending) come back ascending and consecutive."""
    bm = BlockManager(num_blocks=16, block_size=4)
    a = make_seq(range(1, 30), "a")  # 8 blocks
    assert bm.allocate_slots(a, a.num_tokens)
    a.num_computed_tokens = a.num_tokens
    bm.cache_full_blocks(a)
    bm.free(a)
    bm.reset_prefix_cache()
    b = make_seq(range(100, 110), "b")
    assert bm.allocate_slots(b, b.num_tokens)
    b.num_computed_tokens = b.num_tokens
    grow(bm, b, 12)
    assert b.block_table == list(range(b.block_table[0], b.block_table[0] + len(b.block_table)))


def test_a_growing_sequence_takes_its_next_block_over_a_lower_free_one():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=False)
    a, b = make_seq([1] * 4, "a"), make_seq([2] * 4, "b")
    for s in (a, b):
        assert bm.allocate_slots(s, 4)
        s.num_computed_tokens = 4
    assert (a.block_table, b.block_table) == ([0], [1])
    bm.free(a)  # block 0 free again, below b's next block
    grow(bm, b, 1)
    assert b.block_table == [1, 2] and 0 in bm.free_ids


def test_with_no_free_block_the_next_one_is_evicted_instead_of_the_lru_one():
    """A full cache (every block cached and unused): a growing sequence evicts the block after its
    last rather than the least recently released one; a new sequence still evicts LRU first."""
    bm = BlockManager(num_blocks=4, block_size=2)
    old = make_seq([1, 2, 3, 4, 5, 6, 7, 8], "old")
    assert bm.allocate_slots(old, 8)
    old.num_computed_tokens = 8
    bm.cache_full_blocks(old)
    bm.free(old)  # all four evictable, released tail first: LRU order 3, 2, 1, 0
    assert list(bm.evictable) == [3, 2, 1, 0] and not bm.free_ids
    seq = make_seq([1, 2, 9], "hit")  # its first block is a prefix hit on block 0
    hits = bm.match_prefix(seq)
    assert hits == [0]
    bm.admit(seq, hits)
    assert bm.allocate_slots(seq, 1) and seq.block_table == [0, 1]  # block 1 evicted, not LRU block 3
    assert list(bm.evictable) == [3, 2] and bm.evictions == 1
    other = make_seq([7, 7], "new")
    assert bm.allocate_slots(other, 2) and other.block_table == [3]  # a new sequence: LRU first


def test_with_a_free_block_the_next_cached_one_is_kept_and_a_free_one_taken():
    """The next block is evicted only when nothing is free (it would be evicted anyway): while a free
    block exists, a growing sequence whose next block holds a cached prefix takes the free block and
    the cached one stays in the prefix cache."""
    bm = BlockManager(num_blocks=6, block_size=2)
    old = make_seq([1, 2, 3, 4, 5, 6, 7, 8], "old")
    assert bm.allocate_slots(old, 8)
    old.num_computed_tokens = 8
    bm.cache_full_blocks(old)
    bm.free(old)  # blocks 0-3 evictable, 4 and 5 free
    assert sorted(bm.evictable) == [0, 1, 2, 3] and list(bm.free_ids) == [4, 5]
    seq = make_seq([1, 2, 9], "hit")
    hits = bm.match_prefix(seq)
    assert hits == [0]
    bm.admit(seq, hits)
    assert bm.allocate_slots(seq, 1) and seq.block_table == [0, 4]  # free block 4, not cached block 1
    assert sorted(bm.evictable) == [1, 2, 3] and bm.evictions == 0
    assert bm.match_prefix(make_seq([1, 2, 3, 4, 5], "again")) == [0, 1]  # block 1's prefix still cached
