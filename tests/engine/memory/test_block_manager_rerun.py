"""`moe/engine/memory/block_manager.py`: tests from the re-run of the first mutation run's modules
(docs/results/mutation/rerun1b/): the checks of a shared pool and of the group number."""

import pytest

from moe.engine.memory.block_manager import BlockManager, BlockPool


def test_a_shared_pool_must_have_the_managers_block_count():
    pool = BlockPool(3)
    with pytest.raises(ValueError, match="a shared pool of 3 blocks for num_blocks=4"):
        BlockManager(4, 2, pool=pool)  # group 0 is valid: the size alone must be refused
    assert BlockManager(3, 2, pool=pool).pool is pool


@pytest.mark.parametrize("group", [-1, 256, 300])
def test_the_group_number_must_fit_one_byte(group):
    with pytest.raises(ValueError, match=r"group=-?\d+ \(0\.\.255\)"):
        BlockManager(4, 2, group=group)


def test_the_last_one_byte_group_is_accepted():
    assert BlockManager(4, 2, group=255).group_salt == bytes([255])


def test_match_prefix_upto_one_block_and_none():
    """`match_prefix_upto` caps the hits at n blocks: one block is one hit, zero is none."""
    from tests.engine.memory.test_block_manager import make_seq, run_prefill
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make_seq(range(12), "a")
    run_prefill(bm, a)
    longer = make_seq(range(13), "b")
    assert bm.match_prefix_upto(longer, 3) == a.block_table[:3]
    assert bm.match_prefix_upto(longer, 1) == a.block_table[:1]
    assert bm.match_prefix_upto(longer, 0) == []


def test_first_visible_block_with_one_token_blocks():
    """With one-token blocks the first visible block is the window's first position itself, and
    0 while the window still reaches the start."""
    bm = BlockManager(8, 1, enable_prefix_caching=False, sliding_window=4)
    assert [bm.first_visible_block(p) for p in range(7)] == [0, 0, 0, 0, 1, 2, 3]


def test_windowed_match_of_one_block():
    """With a window, a cap of one block still finds the one cached block (the run that covers
    the window can end at the first block)."""
    from tests.engine.memory.test_block_manager import make_seq, run_prefill
    bm = BlockManager(num_blocks=8, block_size=4, sliding_window=4)
    a = make_seq(range(12), "a")
    run_prefill(bm, a)
    longer = make_seq(range(13), "b")
    assert bm.match_prefix_upto(longer, 1) == a.block_table[:1]


def test_a_negative_cap_finds_nothing():
    """`match_prefix_upto` with n < 0 (at most a negative number of blocks) finds no hit; it is not
    a slice from the end of the full match."""
    from tests.engine.memory.test_block_manager import make_seq, run_prefill
    bm = BlockManager(num_blocks=8, block_size=4)
    run_prefill(bm, make_seq(range(12), "a"))
    longer = make_seq(range(13), "b")
    assert len(bm.match_prefix(longer)) == 3
    assert bm.match_prefix_upto(longer, -1) == []


def test_windowed_match_leaves_a_token_of_a_whole_block_prompt_to_compute():
    """With a window, a prompt of exactly k full blocks, all cached, is hit for k - 1 blocks at
    most: its last token is computed (that step yields the logits)."""
    from tests.engine.memory.test_block_manager import make_seq, run_prefill
    bm = BlockManager(num_blocks=8, block_size=4, sliding_window=4)
    a = make_seq(range(13), "a")  # registers its three full blocks
    run_prefill(bm, a)
    exact = make_seq(range(12), "b")  # those three blocks, nothing after
    hits = bm.match_prefix(exact)
    assert len(hits) == 2 and hits[-1] == a.block_table[1]


def test_windowed_match_of_a_prompt_shorter_than_a_block():
    """With a window, a prompt that fills no block has no hit (and no error)."""
    from tests.engine.memory.test_block_manager import make_seq, run_prefill
    bm = BlockManager(num_blocks=8, block_size=4, sliding_window=4)
    run_prefill(bm, make_seq(range(12), "a"))
    for n in (1, 3, 4):
        assert bm.match_prefix(make_seq(range(n), f"s{n}")) == []


def test_can_admit_counts_each_evictable_hit_once():
    """Hits on evictable blocks use up free blocks one each: a cache of exactly the blocks the
    prompt needs admits it again after the first copy is freed."""
    from tests.engine.memory.test_block_manager import make_seq, run_prefill
    bm = BlockManager(num_blocks=4, block_size=4)
    a = make_seq(range(13), "a")
    run_prefill(bm, a)
    bm.free(a)  # three hashed blocks evictable, the partial one free
    b = make_seq(range(13), "b")
    hits = bm.match_prefix(b)
    assert len(hits) == 3 and bm.num_free_blocks == 4
    assert bm.can_admit(hits, b.num_tokens)
    run_prefill(bm, b)
    assert b.block_table[:3] == hits


def test_cache_full_blocks_goes_past_a_released_unregistered_block():
    """A block released out of the window before it was registered is skipped; the full blocks
    after it are still registered by the same call (and a later prompt hits them)."""
    from tests.engine.memory.test_block_manager import make_seq
    bm = BlockManager(num_blocks=8, block_size=2, sliding_window=2)
    s = make_seq(range(8), "a")
    assert bm.allocate_slots(s, 8)
    s.num_computed_tokens = 8  # four full blocks computed, none registered yet
    assert bm.release_out_of_window(s) == 3  # a query from position 8 sees block 3 only
    bm.cache_full_blocks(s)
    assert len(s.block_hashes) == 4
    assert [bm.blocks[b].hash is not None for b in s.block_table[3:]] == [True]
    assert bm.match_prefix(make_seq(range(9), "b")) == [-1, -1, -1, s.block_table[3]]


def test_release_out_of_window_lowers_num_synced_blocks_to_the_first_released_entry():
    """Releasing entries lowers `num_synced_blocks` to the first one released (the tensor copy
    rewrites from there); a call that releases nothing leaves it; the count released is returned."""
    from tests.engine.memory.test_block_manager import make_seq
    bm = BlockManager(num_blocks=16, block_size=2, enable_prefix_caching=False, sliding_window=2)
    s = make_seq(range(12))
    assert bm.allocate_slots(s, 12)
    s.num_synced_blocks = 6  # the tensor copy holds all six entries
    s.num_computed_tokens = 4  # a query from position 4 sees from position 3: block 1
    assert bm.release_out_of_window(s) == 1
    assert s.block_table[0] == -1 and s.num_synced_blocks == 0
    s.num_synced_blocks = 6
    assert bm.release_out_of_window(s) == 0  # nothing more to release
    assert s.num_synced_blocks == 6
    s.num_computed_tokens = 9  # sees from position 8: block 4; blocks 1..3 go
    assert bm.release_out_of_window(s) == 3
    assert s.block_table[:5].count(-1) == 4 and s.block_table[4] != -1 and s.num_synced_blocks == 1
