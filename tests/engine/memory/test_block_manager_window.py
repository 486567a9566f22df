"""A sliding-window block manager (every layer slides: moe.engine.memory.kv_groups) releases the
blocks its window passed, admits only the prefix hits its window still sees, and keeps the table
indexed by position (released entries = NULL_BLOCK; their tensor copy reads block 0)."""

import pytest

from moe.engine.memory.block_manager import NULL_BLOCK, BlockManager
from moe.engine.runner.block_tables import sync
from tests.engine.memory.test_block_manager import make_seq, run_prefill


def decode_to(bm, seq, total):
    """Feed `seq` one token a step (as the scheduler does: allocate, compute) up to `total` tokens;
    the blocks held after each step."""
    held = []
    while seq.num_tokens < total:
        seq.token_ids.append(seq.num_tokens % 97 + 4)
        assert bm.allocate_slots(seq, 1)
        seq.num_computed_tokens += 1
        bm.cache_full_blocks(seq)
        held.append(bm.num_held(seq))
    return held


@pytest.mark.parametrize("window,bs", [(5, 4), (8, 4), (4, 4), (1, 4), (7, 3), (16, 16)])
def test_decode_holds_the_window_and_releases_the_rest(window, bs):
    bm = BlockManager(64, bs, enable_prefix_caching=False, sliding_window=window)
    seq = make_seq(range(3))
    run_prefill(bm, seq)
    held = decode_to(bm, seq, 80)
    assert max(held) <= -(-window // bs) + 1
    assert max(held) >= -(-window // bs)  # (not over-released: the window's blocks are there)
    assert bm.num_used_blocks == bm.num_held(seq)  # the released ones went back to the pool
    c = seq.num_computed_tokens
    first = max(0, c - window + 1) // bs  # the first block a query at c can see
    assert seq.block_table[:first - 1] == [NULL_BLOCK] * (first - 1)  # released before c's step: a prefix
    assert NULL_BLOCK not in seq.block_table[first:]
    assert len(seq.block_table) == -(-c // bs)  # still indexed by position


def test_exact_release_boundary():
    """Window 4, blocks of 4: a query at position p sees p-3..p; block 0 (positions 0-3) is
    released once the next position to compute is 8 (it sees 5..8), not at 7 (it sees 4..7: block 1 on)."""
    bm = BlockManager(16, 4, enable_prefix_caching=False, sliding_window=4)
    seq = make_seq(range(6))
    run_prefill(bm, seq)  # computed 6; query at 6 sees 3..6 -> block 0 stays
    decode_to(bm, seq, 7)  # allocate at computed 6
    assert seq.block_table[0] != NULL_BLOCK
    decode_to(bm, seq, 8)  # allocate at computed 7: sees 4..7: block 0 released
    assert seq.block_table[0] == NULL_BLOCK and seq.block_table[1] != NULL_BLOCK
    decode_to(bm, seq, 12)  # allocate at computed 11: sees 8..11: block 1 released
    assert seq.block_table[:2] == [NULL_BLOCK, NULL_BLOCK] and NULL_BLOCK not in seq.block_table[2:]


def test_tensor_copy_of_released_entries_reads_block_zero():
    bm = BlockManager(32, 4, enable_prefix_caching=False, sliding_window=5)
    seq = make_seq(range(3))
    run_prefill(bm, seq)
    before = sync(seq).tolist()
    decode_to(bm, seq, 40)
    t = sync(seq).tolist()
    assert len(t) == len(seq.block_table) and len(before) == 1
    assert t == [max(b, 0) for b in seq.block_table]  # released entries rewritten, not left stale
    assert t[0] == 0 and seq.block_table[0] == NULL_BLOCK


def test_free_trim_and_preemption_skip_released_entries():
    bm = BlockManager(32, 4, enable_prefix_caching=False, sliding_window=5)
    seq = make_seq(range(3))
    run_prefill(bm, seq)
    decode_to(bm, seq, 30)
    held = bm.num_held(seq)
    assert bm.num_used_blocks == held and NULL_BLOCK in seq.block_table
    bm.trim(seq, seq.num_tokens)  # nothing beyond: unchanged
    assert bm.num_held(seq) == held
    bm.free(seq)  # (preemption frees the same way)
    assert bm.num_used_blocks == 0 and all(b.ref_count == 0 for b in bm.blocks)
    assert sorted(bm.free_ids) == list(range(32))


def test_prefix_hit_takes_only_the_blocks_the_window_sees():
    bm = BlockManager(32, 4, sliding_window=5)
    a = make_seq(range(4, 30))
    run_prefill(bm, a)  # 26 tokens computed at once: 7 blocks, 6 full ones registered
    bm.free(a)
    assert bm.num_used_blocks == 0 and len(bm.evictable) == 6
    b = make_seq(list(range(4, 30)) + [7, 8])
    hits = bm.match_prefix(b)
    assert len(hits) == 6  # 24 tokens cached
    # the query at 24 sees 20..24: block 5 (20..23) is the only cached block it needs
    free_before = bm.num_free_blocks
    assert bm.can_admit(hits, b.num_tokens)
    bm.admit(b, hits)
    assert b.block_table == [NULL_BLOCK] * 5 + [hits[5]] and b.num_computed_tokens == 24
    assert bm.blocks[hits[5]].ref_count == 1 and all(bm.blocks[h].ref_count == 0 for h in hits[:5])
    assert bm.num_free_blocks == free_before - 1
    assert len(b.block_hashes) == 6  # the skipped hits' hashes are recorded: their tokens are cached
    assert bm.allocate_slots(b, 4) and len(b.block_table) == 7
    b.num_computed_tokens = 28
    bm.cache_full_blocks(b)  # block 6 (24..27) registered; the released entries are skipped
    assert len(b.block_hashes) == 7 and bm.blocks[b.block_table[6]].hash == b.block_hashes[6]


def test_can_admit_counts_only_the_hits_it_takes():
    """Cache of 8 blocks: 7 evictable cached blocks of a 28-token prefix and one free. A sequence
    of that prefix + 9 tokens takes 1 cached block (the window's) and 3 fresh ones, evicting cached
    blocks it skipped (the free one first): admissible with a window (without one it would need 7 + 3 blocks)."""
    def cached_prefix(window):
        bm = BlockManager(8, 4, sliding_window=window)
        a = make_seq(range(4, 33))
        run_prefill(bm, a)
        bm.free(a)
        b = make_seq(list(range(4, 32)) + list(range(100, 109)))
        return bm, b, bm.match_prefix(b)

    bm, b, hits = cached_prefix(None)
    assert len(hits) == 7 and not bm.can_admit(hits, b.num_tokens)
    bm, b, hits = cached_prefix(4)
    assert len(hits) == 7 and bm.can_admit(hits, b.num_tokens)
    bm.admit(b, hits)
    assert bm.allocate_slots(b, b.num_tokens - b.num_computed_tokens)
    assert b.block_table[:6] == [NULL_BLOCK] * 6 and b.block_table[6] == hits[6]
    assert bm.num_held(b) == 4 and bm.evictions == 2  # the free block, then two skipped cached ones


def test_no_window_releases_nothing_and_bad_window_refused():
    bm = BlockManager(64, 4, enable_prefix_caching=False)
    seq = make_seq(range(3))
    run_prefill(bm, seq)
    held = decode_to(bm, seq, 60)
    assert held[-1] == 15 and NULL_BLOCK not in seq.block_table
    with pytest.raises(ValueError, match="sliding_window=0"):
        BlockManager(4, 4, sliding_window=0)


@pytest.mark.parametrize("window", [None, 6])
def test_max_blocks_held(window):
    bm = BlockManager(8, 4, sliding_window=window)
    assert bm.max_blocks_held(100, max_chunk=1) == (25 if window is None else 3)  # 6 positions span <= 3 blocks
    assert bm.max_blocks_held(100, max_chunk=16) == (25 if window is None else 6)  # 21 positions: <= 6 blocks
    assert bm.max_blocks_held(5) == 2


def test_prefix_hit_survives_the_eviction_of_blocks_the_window_does_not_see():
    """A released sequence's oldest blocks are evicted first; a later prompt with the same prefix
    still hits as far as the blocks its window sees are cached. A gap inside that window ends the
    hit before the gap; without a window the hit stops at the first evicted block."""
    def cached(window, evict):
        bm = BlockManager(32, 4, sliding_window=window)
        a = make_seq(range(4, 30))  # 6 full blocks cached (24 tokens)
        run_prefill(bm, a)
        hashes = list(a.block_hashes)
        bm.free(a)
        for i in evict:  # (as an allocation would, LRU aside)
            h = hashes[i]
            block = bm.blocks[bm.hash_to_block.pop(h)]
            block.hash = block.token_key = None
            del bm.evictable[block.block_id]
            bm.free_ids.append(block.block_id)
        return bm, bm.match_prefix(make_seq(list(range(4, 30)) + [9, 9]))

    bm, hits = cached(5, evict=[0, 1, 2])  # the query at 24 sees 20..24: block 5 only
    assert hits[:5] == [NULL_BLOCK] * 5 and hits[5] == bm.hash_to_block[bm.blocks[hits[5]].hash]
    _, hits = cached(None, evict=[0, 1, 2])
    assert hits == []
    _, hits = cached(9, evict=[0, 4])  # a query at 24 sees 16..24 (blocks 4, 5): block 4 gone; at 16, 8..16
    assert len(hits) == 4 and hits[:2] == [NULL_BLOCK] * 2 and NULL_BLOCK not in hits[2:]
    _, hits = cached(9, evict=[1, 3])  # ... at 24: blocks 4, 5 cached
    assert len(hits) == 6 and hits[:4] == [NULL_BLOCK] * 4
    _, hits = cached(1, evict=[5])  # a window of 1 sees only the query, but a hit needs a cached block
    assert len(hits) == 5 and hits[:4] == [NULL_BLOCK] * 4 and hits[4] != NULL_BLOCK
    _, hits = cached(1, evict=[0, 1, 2, 3, 4, 5])
    assert hits == []


def test_hits_with_released_entries_admit_and_hash_like_computed_blocks():
    bm = BlockManager(32, 4, sliding_window=5)
    a = make_seq(range(4, 30))
    run_prefill(bm, a)
    hashes = list(a.block_hashes)
    bm.free(a)
    b = make_seq(list(range(4, 30)) + [9, 9])
    run_prefill(bm, b)
    assert b.num_computed_tokens == b.num_tokens and b.block_hashes[:6] == hashes
    assert bm.prefix_hits == 24 and bm.num_held(b) == 2  # block 5 (the hit) and block 6 (the 4 new tokens)
