"""Eviction policies of the fast-tier expert cache, registered by name (`expert_cache.policy`).

A policy sees every use of an expert of its layer (`touch`) and picks the slot to give up
(`victim`) among the resident experts not pinned by the current forward. `prefetches` says whether
the engine runs router-driven lookahead for it; `keeps` False makes every use a miss (the naive
on-demand baseline the benchmark compares against). Pure Python: imported by the engine's config.

Written by hand rather than with functools.lru_cache / cachetools: the cache holds tensor slots
that the caller fills, and a policy must skip experts the running forward still needs.
"""

from __future__ import annotations

import itertools
from typing import Iterable

from moe.registry import Registry

CACHE_POLICIES: Registry = Registry("expert_cache.policy")


class Policy:
    prefetches = False
    keeps = True

    def __init__(self):
        self._clock = itertools.count()
        self.last_use: dict[int, int] = {}

    def touch(self, expert: int) -> None:
        self.last_use[expert] = next(self._clock)

    def forget(self, expert: int) -> None:
        self.last_use.pop(expert, None)

    def rank(self, expert: int) -> tuple:
        """Smaller is evicted first."""
        return (self.last_use.get(expert, -1),)

    def victim(self, resident: Iterable[int], pinned: set[int]) -> int:
        candidates = [e for e in resident if e not in pinned]
        return min(candidates, key=self.rank)


@CACHE_POLICIES.register("lru")
class LRU(Policy):
    """Evict the least recently used expert (mixtral-offloading's cache)."""


@CACHE_POLICIES.register("lfu")
class LFU(Policy):
    """Evict the least frequently used expert (uses counted since the engine started, kept
    after eviction so a popular expert returns ahead of a one-off); ties go to the older use."""

    def __init__(self):
        super().__init__()
        self.uses: dict[int, int] = {}

    def touch(self, expert: int) -> None:
        super().touch(expert)
        self.uses[expert] = self.uses.get(expert, 0) + 1

    def forget(self, expert: int) -> None:
        pass  # the frequency outlives residency

    def rank(self, expert: int) -> tuple:
        return (self.uses.get(expert, 0), self.last_use.get(expert, -1))


@CACHE_POLICIES.register("lookahead")
class Lookahead(LRU):
    """LRU eviction plus prefetch: layer l+1's router applied to layer l's MoE input predicts
    the experts layer l+1 will use, loaded while layer l computes."""

    prefetches = True


@CACHE_POLICIES.register("ondemand")
class OnDemand(LRU):
    """The naive baseline: nothing stays between forwards, every expert use is loaded."""

    keeps = False


def policy_names() -> list[str]:
    return list(CACHE_POLICIES)
