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
