"""One MoE layer's fast tier: `n_slots` expert slots on the compute device (one `[n_slots, ...]`
tensor per stored per-expert tensor: weights, or a quantized module's codes and scales; `stored.py`),
which expert each holds, its eviction policy and its counters. Misses load synchronously; a lookahead prefetch
loads through the same `load` from the engine's prefetch worker (a thread on CPU, a side stream
on CUDA), and every user of the cache first waits for that prefetch (`wait_prefetch`)."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Optional

import torch

from moe.engine.offload.policies import Policy
from moe.engine.offload.slow_tier import SlowTier
from moe.engine.offload.stats import LayerStats


class LayerExpertCache:
    def __init__(self, layer: int, slow: SlowTier, n_slots: int, policy: Policy, device: torch.device):
        self.layer, self.slow, self.n_slots, self.policy = layer, slow, n_slots, policy
        stored = slow.layer(layer)
        self.device = device
        self.n_experts = next(iter(stored.values())).shape[0]
        self.slots = {name: torch.empty((n_slots, *t.shape[1:]), dtype=t.dtype, device=device)
                      for name, t in stored.items()}
        self.expert_bytes = sum(t[0].nbytes for t in stored.values())  # stored bytes: what a load moves
        self.slot_of: dict[int, int] = {}  # resident expert -> its slot
        self.free = list(range(n_slots))
        self.stats = LayerStats()
        self.pending: Optional[Future] = None  # a prefetch in flight for this layer
        self.ready_event = None  # CUDA: the side stream's event after the prefetch's copies
        self.predicted: Optional[set[int]] = None  # lookahead's guess for this layer's next forward

    def wait_prefetch(self) -> None:
        if self.pending is None:
            return
        t0 = time.perf_counter()
        self.pending.result()  # re-raises a failed prefetch here, on the forward's thread
        if self.ready_event is not None:
            torch.cuda.current_stream(self.device).wait_event(self.ready_event)
            self.ready_event = None
        self.pending = None
        self.stats.stall_s += time.perf_counter() - t0

    def load(self, experts: list[int], pinned: set[int], non_blocking: bool = False) -> int:
        """Make `experts` resident, evicting by policy anything not in `pinned`; returns how
        many were copied from the slow tier."""
        copied = 0
        for e in experts:
            if e in self.slot_of:
                continue
            if not self.free:
                victim = self.policy.victim(self.slot_of.keys(), pinned)
                self.free.append(self.slot_of.pop(victim))
                self.policy.forget(victim)
            slot = self._free_slot_for(e)
            for name, t in self.slow.expert(self.layer, e).items():
                self.slots[name][slot].copy_(t, non_blocking=non_blocking)
            self.slot_of[e] = slot
            copied += 1
        self.stats.loads += copied
        self.stats.bytes_moved += copied * self.expert_bytes
        return copied

    def _free_slot_for(self, e: int) -> int:
        """The free slot nearest expert e's place in id order: slots then often stay in id order,
        and a forward runs on them without gathering a sorted copy (OffloadedExperts)."""
        target = e * self.n_slots // self.n_experts
        best = min(range(len(self.free)), key=lambda i: abs(self.free[i] - target))
        return self.free.pop(best)

    def acquire(self, chunk: list[int]) -> list[int]:
        """The slots of `chunk` (at most n_slots experts), loading its misses now; counts uses."""
        self.wait_prefetch()
        hits = sum(e in self.slot_of for e in chunk)
        t0 = time.perf_counter()
        self.load(chunk, pinned=set(chunk))
        self.stats.stall_s += time.perf_counter() - t0
        self.stats.uses += len(chunk)
        self.stats.hits += hits
        self.stats.misses += len(chunk) - hits
        for e in chunk:
            self.policy.touch(e)
        return [self.slot_of[e] for e in chunk]

    def score_prediction(self, used: list[int]) -> None:
        if self.predicted is not None:
            self.stats.predicted_used += len(self.predicted.intersection(used))
            self.stats.predicted_uses += len(used)
            self.predicted = None

    def drop_all(self) -> None:
        """The `ondemand` baseline after each forward: nothing stays."""
        for e in list(self.slot_of):
            self.free.append(self.slot_of.pop(e))
            self.policy.forget(e)
