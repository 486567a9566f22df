"""The KV cache's list of free blocks (those that hold nothing reusable), handed out lowest id first.

Why not first-in first-out: a finished sequence releases its blocks tail first (for the prefix
cache's eviction order), and `reset_prefix_cache` moves the evictable blocks here in that order,
so a FIFO list gave the next sequence descending block ids. The `torch` backend's batch-1 decode
attends over a view of the cache only when a sequence's blocks are consecutive ids ascending
(moe/attention/paged_torch.py `contiguous_span`), so with FIFO almost every sequence after the
first took the gathered path (issue 32: 1,764 of 1,788 decode calls in the batch-1 benchmark).
Here a new sequence gets the lowest free ids (consecutive wherever the free ids are), and a
growing sequence first asks for the id after its last block (`take`), so it stays consecutive
while that block is free, whatever lower ids other sequences have freed meanwhile.

Which blocks are free, and so which cached blocks get evicted, is unchanged: only the order in
which free ones are handed out. The deque methods the block manager and the tests use are kept
(`append`, `popleft`, `clear`, iteration (ascending), `len`, `in`); an id is listed at most once.
"""

from __future__ import annotations

import heapq
from typing import Iterable, Iterator


class FreeBlockIds:
    """Free block ids: `popleft` the lowest, `take(bid)` one given id (a growing sequence's next
    consecutive block). A min-heap with lazy deletion: `take` only drops the id from the member
    set, and `popleft` skips heap entries that are no longer members."""

    __slots__ = ("_heap", "_members")

    def __init__(self, ids: Iterable[int] = ()):
        self._members = set(ids)
        self._heap = sorted(self._members)  # (a sorted list is a heap)

    def append(self, bid: int) -> None:
        self._members.add(bid)
        heapq.heappush(self._heap, bid)

    def popleft(self) -> int:
        """The lowest free id (IndexError when empty, as a deque's)."""
        heap, members = self._heap, self._members
        while heap:
            bid = heapq.heappop(heap)
            if bid in members:
                members.remove(bid)
                return bid
        raise IndexError("pop from an empty FreeBlockIds")

    def take(self, bid: int) -> bool:
        """Remove `bid` if it is free (True), else leave everything as it is (False)."""
        if bid not in self._members:
            return False
        self._members.remove(bid)
        if len(self._heap) > 2 * len(self._members) + 64:  # stale entries: rebuild, amortised O(1)
            self._heap = sorted(self._members)
        return True

    def clear(self) -> None:
        self._heap.clear()
        self._members.clear()

    def __len__(self) -> int:
        return len(self._members)

    def __bool__(self) -> bool:
        return bool(self._members)

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._members))

    def __contains__(self, bid: object) -> bool:
        return bid in self._members

    def __repr__(self) -> str:
        return f"FreeBlockIds({sorted(self._members)})"
