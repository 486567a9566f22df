"""Continuous batching: which sequences run in the next step, and how many tokens each.

Every step has a token budget (`max_num_batched_tokens`) shared by decodes (1 token) and
prefill chunks: running sequences are served first, in arrival order, each with all its
uncomputed tokens that fit (a long prompt is thus prefilled in chunks over several steps,
interleaved with the decodes of the others); waiting sequences are then admitted, oldest
first, while the budget, `max_num_seqs` and the free KV blocks allow (a new sequence first
takes what the prefix cache holds of it). When a running sequence needs a block and none is
free, the most recently admitted running sequence is preempted: its blocks are released and
it goes back to the front of the waiting queue, to be recomputed (prompt + tokens generated
so far, partly from the prefix cache) when it is resumed. No new sequence is admitted in a
step that preempted one.
"""

from __future__ import annotations

from collections import deque
from typing import Optional

from moe.engine.memory.block_manager import BlockManager
from moe.engine.sequence import ScheduledBatch, Sequence, SequenceStatus


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError(f"max_num_seqs={max_num_seqs} and max_num_batched_tokens={max_num_batched_tokens} "
                             "must be >= 1")
        self.bm = block_manager
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Take a (finished or aborted) sequence out of the queues and release its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.bm.free(seq)

    def find(self, request_id: str) -> Optional[Sequence]:
        for seq in (*self.running, *self.waiting):
            if seq.request_id == request_id:
                return seq
        return None

    def _preempt(self, seq: Sequence) -> None:
        self.bm.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.metrics.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def schedule(self) -> ScheduledBatch:
        budget = self.max_num_batched_tokens
        chosen: list[tuple[Sequence, int]] = []
        batch = ScheduledBatch()

        # 1) running sequences, oldest first; preempt from the newest end when blocks run out
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.bm.allocate_slots(seq, n):
                victim = self.running.pop()
                if victim is seq and not self.running:
                    # Alone and still too big: cannot happen when requests are checked on
                    # arrival, but never loop forever.
                    self.bm.free(seq)
                    batch.failed.append(seq)
                    break
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    break
            else:
                chosen.append((seq, n))
                budget -= n
                i += 1
                continue
            break  # `seq` itself was preempted (so was everything after it)

        # 2) waiting sequences, oldest first
        while (not batch.preempted and self.waiting and budget > 0
               and len(self.running) < self.max_num_seqs):
            seq = self.waiting[0]
            hits = self.bm.match_prefix(seq)
            cached = len(hits) * self.bm.block_size
            n = min(seq.num_tokens - cached, budget)
            if not self.bm.can_admit(hits, cached + n):
                break
            self.waiting.popleft()
            self.bm.admit(seq, hits)
            if seq.metrics.num_preemptions == 0:
                seq.metrics.num_cached_prompt_tokens = cached
            ok = self.bm.allocate_slots(seq, n)
            assert ok, "can_admit() promised these blocks"
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            chosen.append((seq, n))
            budget -= n

        # decodes first, then prefill chunks (the kv context splits the batch there)
        chosen.sort(key=lambda sn: sn[1] != 1)
        batch.seqs = [s for s, _ in chosen]
        batch.num_new_tokens = [n for _, n in chosen]
        batch.num_decodes = sum(1 for _, n in chosen if n == 1)
        return batch
