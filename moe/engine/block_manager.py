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
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from typing import Optional

from moe.engine.sequence import Sequence


def hash_block(parent: Optional[bytes], token_ids) -> bytes:
    h = hashlib.blake2b(parent or b"", digest_size=16)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int):
        self.block_id, self.ref_count, self.hash, self.token_ids = block_id, 0, None, None


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks={num_blocks} and block_size={block_size} must be >= 1")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids: deque[int] = deque(range(num_blocks))  # hold nothing reusable
        self.evictable: OrderedDict[int, None] = OrderedDict()  # ref 0 but hashed; oldest first
        self.hash_to_block: dict[bytes, int] = {}
        self.prefix_queries = 0  # tokens looked up on admission
        self.prefix_hits = 0  # of which served from the cache
        self.evictions = 0

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

    # ------------------------------------------------------------------ prefix cache
    def match_prefix(self, seq: Sequence) -> list[int]:
        """Ids of the cached blocks that hold `seq`'s leading full blocks (not yet taken)."""
        if not self.enable_prefix_caching:
            return []
        bs, ids = self.block_size, seq.token_ids
        hits: list[int] = []
        parent = None
        for i in range((len(ids) - 1) // bs):  # leave at least one token to compute
            toks = ids[i * bs:(i + 1) * bs]
            parent = hash_block(parent, toks)
            bid = self.hash_to_block.get(parent)
            if bid is None or self.blocks[bid].token_ids != toks:
                break
            hits.append(bid)
        return hits

    def can_admit(self, hits: list[int], num_tokens: int) -> bool:
        """Whether `hits` plus fresh blocks for `num_tokens` tokens in all can be had now."""
        reclaimed = sum(1 for b in hits if self.blocks[b].ref_count == 0)  # evictable ones we take
        return self.blocks_needed(num_tokens) - len(hits) <= self.num_free_blocks - reclaimed

    def admit(self, seq: Sequence, hits: list[int]) -> None:
        """Give `seq` the cached blocks `hits` (its K/V for those tokens are then computed)."""
        assert not seq.block_table, "admit() expects a sequence without blocks"
        for bid in hits:
            block = self.blocks[bid]
            if block.ref_count == 0:
                del self.evictable[bid]
            block.ref_count += 1
        seq.block_table = list(hits)
        seq.block_hashes = [self.blocks[b].hash for b in hits]
        seq.num_computed_tokens = len(hits) * self.block_size
        self.prefix_queries += seq.num_tokens
        self.prefix_hits += seq.num_computed_tokens

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the full, computed blocks of `seq` not registered yet."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        for i in range(len(seq.block_hashes), seq.num_computed_tokens // bs):
            toks = seq.token_ids[i * bs:(i + 1) * bs]
            h = hash_block(seq.block_hashes[-1] if seq.block_hashes else None, toks)
            seq.block_hashes.append(h)
            block = self.blocks[seq.block_table[i]]
            if block.hash is None and h not in self.hash_to_block:
                block.hash, block.token_ids = h, toks
                self.hash_to_block[h] = block.block_id
            # else: an equal block was registered first (computed in the same step); keep that one

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash (blocks in use keep their K/V, but are no longer shared)."""
        for bid in list(self.evictable):
            self.free_ids.append(bid)
        self.evictable.clear()
        for block in self.blocks:
            block.hash = block.token_ids = None
        self.hash_to_block.clear()

    # ------------------------------------------------------------------ allocation
    def _take_block(self) -> int:
        if self.free_ids:
            bid = self.free_ids.popleft()
        else:
            bid, _ = self.evictable.popitem(last=False)  # least recently released
            block = self.blocks[bid]
            del self.hash_to_block[block.hash]
            block.hash = block.token_ids = None
            self.evictions += 1
        self.blocks[bid].ref_count = 1
        return bid

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Grow `seq.block_table` to hold `num_computed_tokens + num_new_tokens` tokens; False
        (and nothing allocated) when there are not enough free blocks."""
        need = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if need > self.num_free_blocks:
            return False
        for _ in range(need):
            seq.block_table.append(self._take_block())
        return True

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Release `seq`'s blocks beyond those `num_tokens` tokens need, tail first (speculative
        decoding's rollback of rejected tokens; such blocks were never hashed)."""
        keep = self.blocks_needed(num_tokens)
        while len(seq.block_table) > keep:
            self._release(seq.block_table.pop())
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
            block = self.blocks[bid]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.hash is not None:
                    self.evictable[bid] = None
                else:
                    self.free_ids.append(bid)
        seq.block_table = []
        seq.block_hashes = []
