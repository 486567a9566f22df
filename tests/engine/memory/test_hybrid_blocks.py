"""Per-group block tables in one shared pool (moe.engine.memory.hybrid_blocks) and the layout of a
hybrid model's cache (kv_groups.cache_layout): allocation all-or-nothing across groups, the window
group's released blocks serving the full group, prefix hits every group agrees on, group-keyed
hashes, trim and free in every group."""

import pytest
import torch

from moe.config.schema import ModelConfig
from moe.engine import EngineConfig
from moe.engine.memory.block_manager import NULL_BLOCK
from moe.engine.memory.cache_size import num_kv_blocks
from moe.engine.memory.hybrid_blocks import HybridBlockManager
from moe.engine.memory.kv_groups import cache_layout, is_hybrid
from moe.engine.runner.context import PagedKVContext
from moe.engine.sampling.sampler import SamplingParams
from moe.engine.sequence import Sequence

BS, W = 4, 8
BASE = dict(vocab_size=512, d_model=64, n_heads=4, n_kv_heads=2, n_experts=4, expert_hidden=96, max_seq_len=4096)


def seq(tokens, rid="r"):
    return Sequence(rid, None, list(tokens), SamplingParams(), 0.0)


def run(bm, s, upto, chunk=4):
    """Compute `s` up to `upto` tokens, `chunk` a step (allocate, then mark computed and register)."""
    while s.num_computed_tokens < upto:
        n = min(chunk, upto - s.num_computed_tokens)
        assert bm.allocate_slots(s, n)
        s.num_computed_tokens += n
        bm.cache_full_blocks(s)


def held(s):
    return [sum(b != NULL_BLOCK for b in t) for t in (s.block_table, s.kv_group_tables[0].block_table)]


def test_layout_of_alternating_and_unequal_groups():
    alt = ModelConfig(**BASE, n_layers=4, sliding_window=W, layer_types=["sliding", "full"] * 2)
    lay = cache_layout(alt, hybrid=True)
    assert is_hybrid(alt) and lay.windows == [None, W] and lay.layers_per_block == 2
    assert lay.layer_group == (1, 0, 1, 0) and lay.layer_slot == (0, 0, 1, 1)
    one = cache_layout(alt, hybrid=False)  # the one-table layout: layer i in slot i, nothing freed
    assert one.layers_per_block == 4 and one.layer_slot == (0, 1, 2, 3) and one.windows == [None]
    gemma = ModelConfig(**BASE, n_layers=6, sliding_window=W, layer_types=["sliding"] * 5 + ["full"])
    lay = cache_layout(gemma, hybrid=True)
    assert lay.layers_per_block == 5 and lay.layer_slot == (0, 1, 2, 3, 4, 0)  # the full group pads 4 slots
    assert not is_hybrid(ModelConfig(**BASE, n_layers=2, sliding_window=W))  # every layer slides: one group
    # bytes of a block: one layer of each group per slot
    per = PagedKVContext.model_bytes_per_block(alt, BS, torch.float32, layers_per_block=2)
    assert per * 2 == PagedKVContext.model_bytes_per_block(alt, BS, torch.float32)


def test_context_layers_share_slots_across_groups():
    cfg = ModelConfig(**BASE, n_layers=4, sliding_window=W, layer_types=["sliding", "full"] * 2)
    ctx = PagedKVContext.for_model(cfg, 10, BS, torch.float32, torch.device("cpu"), None,
                                   layout=cache_layout(cfg, hybrid=True))
    assert ctx.kv.shape[:3] == (2, 2, 10) and ctx.layer_group == (1, 0, 1, 0)
    assert ctx.k_caches[0].data_ptr() == ctx.k_caches[1].data_ptr() == ctx.kv[0, 0].data_ptr()
    assert ctx.v_caches[3].data_ptr() == ctx.kv[1, 1].data_ptr()


def test_window_group_releases_into_the_shared_pool():
    bm = HybridBlockManager(40, BS, True, [None, W])
    s = seq(range(100, 160))
    run(bm, s, 60)
    full, window = held(s)
    assert full == 15 and window <= -(-(W - 1 + 4) // BS) + 1
    assert bm.num_used_blocks == full + window  # the released window blocks went back to the pool
    assert s.kv_group_tables[0].block_table[0] == NULL_BLOCK and NULL_BLOCK not in s.block_table
    assert bm.max_blocks_held(60, 4) == 15 + 4
    bm.trim(s, 40)
    assert len(s.block_table) == len(s.kv_group_tables[0].block_table) == 10
    bm.free(s)
    assert bm.num_used_blocks == 0 and s.block_table == [] and s.kv_group_tables[0].block_table == []


def test_allocation_is_all_or_nothing_across_groups():
    bm = HybridBlockManager(5, BS, False, [None, W])
    s = seq(range(40))
    assert bm.allocate_slots(s, 8)  # 2 blocks in each group: 4 of 5
    before = (list(s.block_table), list(s.kv_group_tables[0].block_table), bm.num_free_blocks)
    assert not bm.allocate_slots(s, 12)  # 3 more in each group: 6 > the 1 free
    assert (s.block_table, s.kv_group_tables[0].block_table, bm.num_free_blocks) == before


def test_prefix_hit_is_what_every_group_holds():
    bm = HybridBlockManager(64, BS, True, [None, W])
    a = seq(range(200, 240), "a")
    run(bm, a, 40)
    bm.free(a)
    b = seq(list(range(200, 240)) + [7, 7, 7], "b")
    hits = bm.match_prefix(b)
    assert len(hits) == 10 and len(hits.groups[1]) == 10
    # the full group keeps every block; the window group only the blocks its window sees from position 40
    assert NULL_BLOCK not in hits.groups[0] and hits.groups[1][:8] == [NULL_BLOCK] * 8
    assert set(hits.groups[0]).isdisjoint(hits.groups[1][8:])  # group-keyed hashes: other layers' K/V
    assert bm.can_admit(hits, 43)
    bm.admit(b, hits)
    assert b.num_computed_tokens == 40 and bm.prefix_hits == 40 and bm.prefix_queries == 43
    bm.free(b)
    # evict the window group's last cached block: the window no longer sees a cached run at 10 blocks,
    # so the full group's hit is lowered to one every group can serve
    last = hits.groups[1][9]
    bm.pool.evictable.move_to_end(last, last=False)
    bm.allocate_slots(seq(range(4), "c"), 1)  # takes 2 blocks: the free ones first
    while last in bm.pool.evictable:
        bm.pool.free_ids.clear()
        bm.allocate_slots(seq(range(4), "d"), 1)
    low = bm.match_prefix(seq(list(range(200, 240)) + [7], "e"))
    assert 0 < len(low) < 10 and len(low.groups[0]) == len(low.groups[1])


def test_cpu_cache_sizing_counts_every_group():
    cfg = EngineConfig(block_size=16, max_num_seqs=2, max_num_batched_tokens=64)
    n = num_kv_blocks(cfg, 1024, 4096, torch.device("cpu"), windows=[None, 128])
    assert n == 2 * (256 + -(-(128 - 1 + 64 + 15) // 16))


def test_needs_two_groups():
    with pytest.raises(ValueError, match="needs >= 2 KV cache groups"):
        HybridBlockManager(8, BS, True, [None])


def test_the_window_releases_before_the_pool_is_counted():
    """12 blocks: 24 tokens hold 6 full + 3 window blocks; 8 more tokens need 2 + 2, which fit only
    once the window group has released the block its window passed."""
    bm = HybridBlockManager(12, BS, False, [None, W])
    s = seq(range(40))
    run(bm, s, 24)
    assert held(s) == [6, 3] and bm.num_free_blocks == 3
    assert bm.allocate_slots(s, 8)
    assert held(s) == [8, 4] and bm.num_free_blocks == 0
