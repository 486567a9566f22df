"""Per-group block tables of a hybrid model (full and sliding layers: GPT-OSS, Gemma-style).

Layout (vLLM's hybrid KV cache manager, option "one shared pool"): every KV cache group
(moe.engine.memory.kv_groups) has its own `BlockManager` over ONE shared `BlockPool`; a pool
block holds `layers_per_block` layers' K/V (one layer of each group per slot: `cache_layout`), so
a block the window group releases serves the full group on its next allocation. Chosen over one
pool per group because per-group pools need a split of the memory fixed at start (the window
group's share idle when sequences are short, the full group starved when they are long); the
shared pool's cost is padding when groups have unequal layer counts (`CacheLayout`).

A sequence's group 0 table is `seq.block_table` itself (group 0 is the full-attention group when
there is one: what every reader of `seq.block_table` expects); group g > 0 lives in a
`GroupTable` (`seq.kv_group_tables[g - 1]`), which has its own table, registered hashes, tensor
copy and prefix memo and reads the tokens, positions and chained hashes of its sequence. Each group
manager then runs unchanged on its own view: the window group frees what its window passed, the
full group keeps everything.

Every operation spans the groups: an allocation succeeds in all or in none (the window groups
release first), a prefix hit counts only blocks every group still holds (`match_prefix`: the
full group's hit, then each window group's longest hit at or below it, until they agree), and
free / trim / register apply to each group.
"""

from __future__ import annotations

from typing import Optional

from moe.engine.memory.block_manager import BlockManager, BlockPool
from moe.engine.memory.kv_groups import blocks_held
from moe.engine.sequence import Sequence


class GroupTable:
    """One sequence's block table in one KV cache group (g > 0), as a `BlockManager` reads a
    sequence: its own table state; the tokens, positions and chained hashes are the sequence's."""

    def __init__(self, seq: Sequence):
        self.seq = seq
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []
        self.block_table_tensor = None
        self.num_synced_blocks = 0
        self.prefix_match = None

    token_ids = property(lambda self: self.seq.token_ids)
    token_hashes = property(lambda self: self.seq.token_hashes)
    num_tokens = property(lambda self: self.seq.num_tokens)
    num_draft_tokens = property(lambda self: self.seq.num_draft_tokens)

    @property
    def num_computed_tokens(self) -> int:
        return self.seq.num_computed_tokens

    @num_computed_tokens.setter
    def num_computed_tokens(self, n: int) -> None:
        self.seq.num_computed_tokens = n


def group_views(seq: Sequence, num_groups: int) -> list:
    """`seq` as each group's manager sees it: itself for group 0, then its `GroupTable`s."""
    if len(seq.kv_group_tables) != num_groups - 1:
        seq.kv_group_tables = [GroupTable(seq) for _ in range(num_groups - 1)]
    return [seq, *seq.kv_group_tables]


class HybridHits:
    """A prefix hit across groups: `len` = blocks hit (the same in every group), `groups[g]` the
    hit entries of group g (NULL_BLOCK where its window no longer sees them)."""

    def __init__(self, groups: list[list[int]]):
        self.groups = groups

    def __len__(self) -> int:
        return len(self.groups[0])


class HybridBlockManager:
    """The `BlockManager` interface the scheduler, the engine and the speculative rollback use,
    over one manager per KV cache group sharing one pool."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool, windows: list[Optional[int]]):
        if len(windows) < 2:
            raise ValueError(f"a hybrid block manager needs >= 2 KV cache groups, got windows {windows}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self.groups = [BlockManager(num_blocks, block_size, enable_prefix_caching, w, pool=self.pool, group=g)
                       for g, w in enumerate(windows)]
        self.windows = list(windows)
        self.sliding_window = windows[0]  # group 0's (what `seq.block_table` follows)
        self.blocks, self.free_ids, self.evictable = self.pool.blocks, self.pool.free_ids, self.pool.evictable
        self.hash_to_block = self.pool.hash_to_block

    def views(self, seq: Sequence) -> list:
        return group_views(seq, len(self.groups))

    # ------------------------------------------------------------------ accounting
    num_free_blocks = property(lambda self: self.groups[0].num_free_blocks)
    num_used_blocks = property(lambda self: self.groups[0].num_used_blocks)
    # prefix-cache counters: group 0's (every group admits the same tokens)
    hit_rate = property(lambda self: self.groups[0].hit_rate)

    @property
    def prefix_queries(self) -> int:
        return self.groups[0].prefix_queries

    @prefix_queries.setter
    def prefix_queries(self, n: int) -> None:
        for m in self.groups:
            m.prefix_queries = n

    @property
    def prefix_hits(self) -> int:
        return self.groups[0].prefix_hits

    @prefix_hits.setter
    def prefix_hits(self, n: int) -> None:
        for m in self.groups:
            m.prefix_hits = n

    @property
    def evictions(self) -> int:
        return self.pool.evictions

    @evictions.setter
    def evictions(self, n: int) -> None:
        self.pool.evictions = n

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def max_blocks_held(self, num_tokens: int, max_chunk: Optional[int] = None) -> int:
        """The most pool blocks one sequence holds at once: its blocks in every group."""
        return sum(blocks_held(num_tokens, self.block_size, w, max_chunk) for w in self.windows)

    def num_held_per_group(self, seq: Sequence) -> list[int]:
        return [BlockManager.num_held(v) for v in self.views(seq)]

    # ------------------------------------------------------------------ prefix cache
    def match_prefix(self, seq: Sequence) -> HybridHits:
        """The longest prefix of blocks every group can serve: the first group's own hit, then each
        other group's longest hit at or below it (a window group needs only its window's blocks
        cached), lowered until every group agrees (each pass can only lower it)."""
        views = self.views(seq)
        if not self.enable_prefix_caching:
            return HybridHits([[] for _ in views])
        hits = [self.groups[0].match_prefix(views[0])]
        k = len(hits[0])
        while True:
            hits = [m.match_prefix_upto(v, k) for m, v in zip(self.groups, views)]
            low = min(len(h) for h in hits)
            if low == k:
                return HybridHits(hits)
            k = low

    def can_admit(self, hits: HybridHits, num_tokens: int) -> bool:
        """Whether every group's hits plus its fresh blocks for `num_tokens` tokens fit in the pool."""
        fresh = reclaimed = 0
        for m, h in zip(self.groups, hits.groups):
            taken = h[m.first_visible_block(len(h) * self.block_size):]
            reclaimed += sum(1 for b in taken if self.blocks[b].ref_count == 0)
            fresh += self.blocks_needed(num_tokens) - len(h)
        return fresh <= self.num_free_blocks - reclaimed

    def admit(self, seq: Sequence, hits: HybridHits) -> None:
        for m, v, h in zip(self.groups, self.views(seq), hits.groups):
            m.admit(v, h)

    def cache_full_blocks(self, seq: Sequence) -> None:
        for m, v in zip(self.groups, self.views(seq)):
            m.cache_full_blocks(v)

    def reset_prefix_cache(self) -> None:
        self.groups[0].reset_prefix_cache()  # (the registry is the pool's: one reset clears every group's)

    # ------------------------------------------------------------------ allocation
    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Grow every group's table for `num_new_tokens` more tokens, or none (False) when the pool
        lacks blocks; the window groups release what their windows passed first, either way."""
        views = self.views(seq)
        for m, v in zip(self.groups, views):
            if m.sliding_window is not None:
                m.release_out_of_window(v)
        total = self.blocks_needed(seq.num_computed_tokens + num_new_tokens)
        if sum(max(0, total - len(v.block_table)) for v in views) > self.num_free_blocks:
            return False
        for m, v in zip(self.groups, views):
            ok = m.allocate_slots(v, num_new_tokens)
            assert ok, "the pool held every group's blocks"
        return True

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        for m, v in zip(self.groups, self.views(seq)):
            m.trim(v, num_tokens)

    def free(self, seq: Sequence) -> None:
        for m, v in zip(self.groups, self.views(seq)):
            m.free(v)
