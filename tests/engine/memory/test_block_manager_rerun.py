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
