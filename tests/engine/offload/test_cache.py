"""The parts below the engine: eviction order of each policy, the memory-mapped slow tier, and
the cache's pinning (a forward's own experts are never evicted to make room for each other)."""

from __future__ import annotations

import torch

from moe.engine.offload.cache import LayerExpertCache
from moe.engine.offload.policies import CACHE_POLICIES
from moe.engine.offload.slow_tier import SlowTier, write_slow_tier


def test_lru_and_lfu_victims():
    lru, lfu = CACHE_POLICIES.lookup("lru")(), CACHE_POLICIES.lookup("lfu")()
    for e in (0, 1, 0, 0, 2, 1):
        lru.touch(e)
        lfu.touch(e)
    assert lru.victim([0, 1, 2], pinned=set()) == 0  # used longest ago
    assert lfu.victim([0, 1, 2], pinned=set()) == 2  # used once
    assert lfu.victim([0, 1, 2], pinned={2}) == 1
    assert CACHE_POLICIES.lookup("lookahead").prefetches and not CACHE_POLICIES.lookup("ondemand").keeps


def test_slow_tier_round_trip_and_cache_loads(tmp_path):
    g = torch.Generator().manual_seed(0)
    gate_up, down = torch.randn(5, 6, 4, generator=g), torch.randn(5, 4, 3, generator=g)
    path = str(tmp_path / "experts.safetensors")
    write_slow_tier(path, {3: {"gate_up_proj": gate_up, "down_proj": down}})
    slow = SlowTier(path)
    assert torch.equal(slow.expert(3, 4)["gate_up_proj"], gate_up[4]) and torch.equal(slow.expert(3, 1)["down_proj"], down[1])
    cache = LayerExpertCache(3, slow, 2, CACHE_POLICIES.lookup("lru")(), torch.device("cpu"))
    slots = cache.acquire([1, 4])
    assert torch.equal(cache.slots["gate_up_proj"][slots[1]], gate_up[4])
    assert torch.equal(cache.slots["down_proj"][slots[0]], down[1])
    cache.acquire([4])
    slots = cache.acquire([0, 4])  # evicts 1 (least recent), keeps 4
    assert set(cache.slot_of) == {0, 4} and torch.equal(cache.slots["gate_up_proj"][slots[0]], gate_up[0])
    s = cache.stats
    assert (s.uses, s.hits, s.misses, s.loads) == (5, 2, 3, 3)
    assert s.bytes_moved == 3 * (gate_up[0].nbytes + down[0].nbytes)


def test_chunks_keep_the_resident_sum_order():
    from moe.engine.offload.chunks import exact_chunks
    assert exact_chunks([[0, 1], [2, 3]], [0, 1, 2, 3], 4) == [[0, 1, 2, 3]]
    assert exact_chunks([[0, 1], [2, 3]], [0, 1, 2, 3], 2) == [[0, 1], [2, 3]]
    # token 0 uses 0, 1, 2, 3: after the chunk [0, 1], its 2 and 3 may not share a chunk
    assert exact_chunks([[0, 1, 2, 3]], [0, 1, 2, 3], 2) == [[0, 1], [2], [3]]
    # why: summing chunk outputs as a + (b + c) is not the resident ((0 + a) + b) + c in float
    a, b, c = (torch.tensor([v], dtype=torch.float32) for v in (1e8, 3.0, 3.0))
    assert not torch.equal(a + (b + c), (a + b) + c)
