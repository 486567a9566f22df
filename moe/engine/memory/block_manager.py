"""KV cache blocks: allocation, reference counts and prefix caching.

The cache is `num_blocks` blocks of `block_size` token slots. A sequence owns the blocks of its
`block_table`, in order. With prefix caching, every *full* block whose K/V have been computed
is registered under a hash chained to its parent's (`blake2b(parent_hash + tokens)`), so equal
prefixes map to equal hashes; a new sequence whose leading blocks' hashes are registered reuses
those blocks (reference count + 1) instead of computing them. Hits are also checked token by
token, so a hash collision can never serve wrong K/V.

A block whose reference count drops to 0 keeps its K/V and its hash: it goes to an LRU list of
evictable blocks and can still be hit until a new allocation needs it (free blocks that hold
nothing are used first; a sequence's blocks are released tail first, so its prefix survives
longer). The prefix match always leaves at least one token to compute, since the step that
computes the last prompt token is the one that yields the logits.

Each full block's chained hash is computed once per sequence (`seq.token_hashes`, extended as
needed): a long prompt waiting for blocks is not re-hashed from token 0 at every admission
attempt, and registering its computed blocks reuses the same hashes. Whenever a sequence's
`block_table` is replaced or shortened, `seq.num_synced_blocks` is lowered to the entries that
stay current, so its persistent tensor copy (moe.engine.runner.block_tables) rewrites only the rest.

With `sliding_window` (a model whose layers all slide with that window: moe.engine.memory.kv_groups)
a block whose every position is older than what the next query can see (position
`num_computed_tokens - sliding_window + 1`) is released as decoding passes it (`allocate_slots`
first frees those), and an admitted prefix hit takes only the cached blocks the window still sees.
The table stays indexed by position: a released block's entry becomes `NULL_BLOCK` (-1; its tensor
copy points at block 0, which the window masks out). Speculative proposals start at
`num_computed_tokens` and a rollback never goes below it, so their keys are never freed. Released
blocks keep their hash (they are evictable, hittable): their K/V stay valid until evicted. A prefix
hit then needs only the blocks its window sees to be cached (`_match_window`), since a sequence's
oldest blocks, released first, are the first evicted.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from typing import Optional

from moe.engine.memory.free_list import FreeBlockIds
from moe.engine.memory.kv_groups import blocks_held
from moe.engine.sequence import Sequence

NULL_BLOCK = -1  # a block-table entry whose block was released (out of a sliding window)


def token_bytes(token_ids) -> bytes:
    return array("q", token_ids).tobytes()


def hash_block(parent: Optional[bytes], token_ids) -> bytes:
    h = hashlib.blake2b(parent or b"", digest_size=16)
    h.update(token_bytes(token_ids))
    return h.digest()


class Block:
    """`token_key`: the tokens of a registered block as bytes (`token_bytes`): a bytes object is
    not tracked by Python's garbage collector, where millions of lists (a cache of 128k-token
    sequences) made every full collection, and so some engine steps, slower."""

    __slots__ = ("block_id", "ref_count", "hash", "token_key")

    def __init__(self, block_id: int):
        self.block_id, self.ref_count, self.hash, self.token_key = block_id, 0, None, None

    @property
    def token_ids(self) -> Optional[list[int]]:
        """The registered block's tokens (None when it holds no hash)."""
        return None if self.token_key is None else array("q", self.token_key).tolist()


class BlockPool:
    """The blocks, their free and evictable lists and the prefix-cache registry: owned by one
    manager, or shared by the per-group managers of a hybrid model (moe.engine.memory.hybrid_blocks),
    whose released window blocks then serve every group."""

    def __init__(self, num_blocks: int):
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids = FreeBlockIds(range(num_blocks))  # hold nothing reusable; lowest id first (free_list.py)
        self.evictable: OrderedDict[int, None] = OrderedDict()  # ref 0 but hashed; oldest first
        self.hash_to_block: dict[bytes, int] = {}
        self.evictions = 0
        self.epoch = 0  # + 1 whenever a registered block loses its hash (eviction, reset)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 sliding_window: Optional[int] = None, pool: Optional[BlockPool] = None, group: int = 0):
        """`pool`: share another manager's blocks (a hybrid model's KV cache groups); `group` (< 256)
        then keeps this manager's registered hashes apart from the other groups' (the same tokens
        are other layers' K/V there)."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks={num_blocks} and block_size={block_size} must be >= 1")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window={sliding_window} must be >= 1 (or None: keep every block)")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.sliding_window = sliding_window
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = pool if pool is not None else BlockPool(num_blocks)
        if len(self.pool.blocks) != num_blocks or not 0 <= group < 256:
            raise ValueError(f"a shared pool of {len(self.pool.blocks)} blocks for num_blocks={num_blocks}, "
                             f"group={group} (0..255)")
        self.group_salt = bytes([group]) if group else b""  # group 0's keys are the plain chained hashes
        # (the pool's containers, shared by reference: mutated in place, never rebound)
        self.blocks, self.free_ids, self.evictable = self.pool.blocks, self.pool.free_ids, self.pool.evictable
        self.hash_to_block = self.pool.hash_to_block
        self.prefix_queries = 0  # tokens looked up on admission
        self.prefix_hits = 0  # of which served from the cache

    @property
    def evictions(self) -> int:
        return self.pool.evictions

    @evictions.setter
    def evictions(self, n: int) -> None:
        self.pool.evictions = n

    @property
    def _cache_epoch(self) -> int:
        return self.pool.epoch

    @_cache_epoch.setter
    def _cache_epoch(self, n: int) -> None:
        self.pool.epoch = n

    def cache_key(self, h: bytes) -> bytes:
        """The registry key of chained hash `h` in this manager's group."""
        return h + self.group_salt

    # ------------------------------------------------------------------ accounting
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids) + len(self.evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def max_blocks_held(self, num_tokens: int, max_chunk: Optional[int] = None) -> int:
        """The most blocks a sequence of `num_tokens` tokens holds at once (all of them without a
        window), computing at most `max_chunk` tokens a step."""
        return blocks_held(num_tokens, self.block_size, self.sliding_window, max_chunk)

    def first_visible_block(self, position: int) -> int:
        """Index of the first block a query at `position` (or later) can still see."""
        if self.sliding_window is None:
            return 0
        return max(0, position - self.sliding_window + 1) // self.block_size

    @staticmethod
    def num_held(seq: Sequence) -> int:
        """Blocks `seq` holds (its table's entries less the released ones)."""
        return sum(1 for b in seq.block_table if b != NULL_BLOCK)

    # ------------------------------------------------------------------ prefix cache
    def _token_hash(self, seq: Sequence, i: int) -> bytes:
        """The chained hash of `seq`'s i-th full block of tokens (those before it hashed first),
        computed once per sequence. Only final tokens are ever hashed (no speculative proposals:
        those are never computed-and-registered, nor present while a sequence waits), so the
        hashes stay valid as long as the tokens they cover exist. A rollback is seen when the
        memo is next read with fewer full blocks; one that regrows the same length before any read
        would keep stale hashes (clear `seq.token_hashes` there)."""
        hs, bs = seq.token_hashes, self.block_size
        if len(hs) > len(seq.token_ids) // bs:  # tokens rolled back since: drop their hashes
            del hs[len(seq.token_ids) // bs:]
        while len(hs) <= i:
            j = len(hs)
            hs.append(hash_block(hs[-1] if hs else None, seq.token_ids[j * bs:(j + 1) * bs]))
        return hs[i]

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Ids of the cached blocks that hold `seq`'s leading full blocks (not yet taken).
        A sequence's previous match is kept (`seq.prefix_match`): registered blocks lose their
        hash only by eviction or reset, so while neither happened its hits still hold and only
        the blocks after them are looked up (a long prompt waiting for blocks costs no re-check
        of its whole prefix at every admission attempt)."""
        if not self.enable_prefix_caching:
            return []
        n = (len(seq.token_ids) - 1) // self.block_size  # leave at least one token to compute
        if self.sliding_window is not None:
            return self._match_window(seq, n)
        epoch, hits = seq.prefix_match or (None, [])
        hits = hits[:n] if epoch == self._cache_epoch else []
        for i in range(len(hits), n):
            bid = self._cached(seq, i)
            if bid is None:
                break
            hits.append(bid)
        seq.prefix_match = (self._cache_epoch, hits)
        return list(hits)

    def match_prefix_upto(self, seq: Sequence, n: int) -> list[int]:
        """`match_prefix` of at most `n` blocks (a hybrid model's groups agreeing on one hit length):
        with a window, the longest hit at or below n whose window is cached, else the first n hits."""
        if not self.enable_prefix_caching or n <= 0:
            return []
        if self.sliding_window is not None:
            return self._match_window(seq, n)
        return self.match_prefix(seq)[:n]

    def _cached(self, seq: Sequence, i: int) -> Optional[int]:
        """The cached block holding `seq`'s i-th full block of tokens, or None."""
        bs = self.block_size
        bid = self.hash_to_block.get(self.cache_key(self._token_hash(seq, i)))
        if bid is None or self.blocks[bid].token_key != token_bytes(seq.token_ids[i * bs:(i + 1) * bs]):
            return None
        return bid

    def _match_window(self, seq: Sequence, n: int) -> list[int]:
        """`match_prefix` with a window: the longest k <= n such that the blocks a query at position
        k * block_size sees (its window's, before it) are cached, whatever became of the earlier
        ones (a sequence releases its oldest blocks first, so they are the first evicted). Scanned
        right to left, as vLLM's sliding-window manager does: a run of cached blocks ending at block
        `end` is a hit once it covers the window; a block not cached restarts the run before it.
        Entries the window does not see are NULL_BLOCK."""
        end, i = n, n - 1  # the run of cached blocks is i+1 .. end-1
        found: dict[int, int] = {}
        while end > 0:
            # (at least the block before the query: with a window of 1 none is seen, but a hit of
            # nothing cached would count tokens never computed as served from the cache)
            first = min(self.first_visible_block(end * self.block_size), end - 1)
            if first > i:  # the run covers the window
                return [NULL_BLOCK] * first + [found[j] for j in range(first, end)]
            bid = self._cached(seq, i)
            if bid is None:
                end = i
            else:
                found[i] = bid
            i -= 1
        return []

    def can_admit(self, hits: list[int], num_tokens: int) -> bool:
        """Whether `hits` plus fresh blocks for `num_tokens` tokens in all can be had now."""
        taken = hits[self.first_visible_block(len(hits) * self.block_size):]
        reclaimed = sum(1 for b in taken if self.blocks[b].ref_count == 0)  # evictable ones we take
        return self.blocks_needed(num_tokens) - len(hits) <= self.num_free_blocks - reclaimed

    def admit(self, seq: Sequence, hits: list[int]) -> None:
        """Give `seq` the cached blocks `hits` (its K/V for those tokens are then computed); with a
        window, only those the window still sees from the first uncomputed position: the others'
        entries are NULL_BLOCK (their hashes are recorded all the same: the tokens are cached)."""
        assert not seq.block_table, "admit() expects a sequence without blocks"
        seq.block_hashes = [self._token_hash(seq, i) for i in range(len(hits))]  # (= the hits' own hashes)
        first = self.first_visible_block(len(hits) * self.block_size)
        for bid in hits[first:]:
            block = self.blocks[bid]
            if block.ref_count == 0:
                del self.evictable[bid]
            block.ref_count += 1
        seq.block_table = [NULL_BLOCK] * first + hits[first:]
        seq.num_synced_blocks = 0
        seq.num_computed_tokens = len(hits) * self.block_size
        self.prefix_queries += seq.num_tokens
        self.prefix_hits += seq.num_computed_tokens

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the full, computed blocks of `seq` not registered yet."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        for i in range(len(seq.block_hashes), seq.num_computed_tokens // bs):
            h = self._token_hash(seq, i)
            seq.block_hashes.append(h)
            if seq.block_table[i] == NULL_BLOCK:  # released before it was registered: nothing to cache
                continue
            block, key = self.blocks[seq.block_table[i]], self.cache_key(h)
            if block.hash is None and key not in self.hash_to_block:
                block.hash, block.token_key = key, token_bytes(seq.token_ids[i * bs:(i + 1) * bs])
                self.hash_to_block[key] = block.block_id
            # else: an equal block was registered first (computed in the same step); keep that one

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash (blocks in use keep their K/V, but are no longer shared)."""
        for bid in list(self.evictable):
            self.free_ids.append(bid)
        self.evictable.clear()
        for block in self.blocks:
            block.hash = block.token_key = None
        self.hash_to_block.clear()
        self._cache_epoch += 1

    # ------------------------------------------------------------------ allocation
    def _take_block(self) -> int:
        if self.free_ids:
            bid = self.free_ids.popleft()
        else:
            bid = next(iter(self.evictable))  # least recently released
            self._evict(bid)
        self.blocks[bid].ref_count = 1
        return bid

    def _evict(self, bid: int) -> None:
        """Take evictable block `bid` out of the prefix cache (its K/V are about to be overwritten)."""
        del self.evictable[bid]
        block = self.blocks[bid]
        del self.hash_to_block[block.hash]
        block.hash = block.token_key = None
        self.evictions += 1
        self._cache_epoch += 1

    def _take_next(self, bid: int) -> bool:
        """Take block `bid` (the one after a growing sequence's last) if it is free; or, when no
        block is free at all (so a cached block is evicted either way), if it is evictable: then it
        is evicted instead of the least recently released one (a full cache, e.g. sized to one
        sequence at batch 1, otherwise hands every block out of order)."""
        if not self.free_ids.take(bid):
            if self.free_ids or bid not in self.evictable:
                return False
            self._evict(bid)
        self.blocks[bid].ref_count = 1
        return True

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Grow `seq.block_table` to hold `num_computed_tokens + num_new_tokens` tokens; False
        (and nothing allocated) when there are not enough free blocks. With a window, the blocks
        it no longer sees are released first (whether or not the growth then succeeds)."""
        if self.sliding_window is not None:
            self.release_out_of_window(seq)
        need = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if need > self.num_free_blocks:
            return False
        # Consecutive ids where possible (the torch backend's batch-1 decode then views the cache
        # without a gather: moe/engine/memory/free_list.py): the block after the sequence's last one
        # if it is free (`_take_next`), else the lowest free (or least recently released evictable) one; the ids
        # taken together are sorted, since evicted blocks come tail first (a freed table's LRU order).
        prev = next((b for b in reversed(seq.block_table) if b != NULL_BLOCK), None)
        taken = []
        for _ in range(need):
            if prev is not None and self._take_next(prev + 1):
                bid = prev + 1
            else:
                bid = self._take_block()
            taken.append(bid)
            prev = bid
        seq.block_table.extend(sorted(taken))
        return True

    def release_out_of_window(self, seq: Sequence) -> int:
        """Release `seq`'s blocks that no query from `num_computed_tokens` on can see (their
        entries become NULL_BLOCK); returns how many. Released entries are a prefix of the table,
        so the walk goes down from the first needed block to the previous release."""
        first = min(self.first_visible_block(seq.num_computed_tokens), len(seq.block_table))
        i = first - 1
        while i >= 0 and seq.block_table[i] != NULL_BLOCK:
            self._release(seq.block_table[i])
            seq.block_table[i] = NULL_BLOCK
            i -= 1
        if i < first - 1:  # entries i+1 .. first-1 changed: the tensor copy rewrites from there
            seq.num_synced_blocks = min(seq.num_synced_blocks, i + 1)
        return first - 1 - i

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Release `seq`'s blocks beyond those `num_tokens` tokens need, tail first (speculative
        decoding's rollback of rejected tokens; such blocks were never hashed)."""
        keep = self.blocks_needed(num_tokens)
        while len(seq.block_table) > keep:
            bid = seq.block_table.pop()
            if bid != NULL_BLOCK:
                self._release(bid)
        seq.num_synced_blocks = min(seq.num_synced_blocks, keep)
        del seq.block_hashes[keep:]

    def _release(self, bid: int) -> None:
        block = self.blocks[bid]
        block.ref_count -= 1
        if block.ref_count == 0:
            if block.hash is not None:
                self.evictable[bid] = None
            else:
                self.free_ids.append(bid)

    def free(self, seq: Sequence) -> None:
        """Release `seq`'s blocks, tail first (hashed ones stay hittable until evicted)."""
        for bid in reversed(seq.block_table):
            if bid != NULL_BLOCK:
                self._release(bid)
        seq.block_table = []
        seq.num_synced_blocks = 0
        seq.block_hashes = []
