"""One model step on every rank: rank 0 prepares the step's plan (token ids, positions, slot
mapping, block tables, logits rows) with the ordinary `ModelRunner.prepare`, sends it to the
workers, and every rank runs its shard of the forward over its own KV-cache shard; the logits come
out whole on rank 0 (the LM head's all-gather), which samples once, as the single-process engine does."""

from __future__ import annotations

import dataclasses
import os
import resource
import time
from typing import Optional

import torch

from moe.engine.runner.context import AttentionMetadata
from moe.engine.runner.model_runner import ModelRunner, only_rows
from moe.engine.sequence import ScheduledBatch


def rank_stats(rank: int, runner: ModelRunner, group, steps: int, forward_s: float) -> dict:
    """One rank's own figures for the server's per-rank `/metrics` series: the forwards it ran, the
    seconds in them and in collectives, its KV cache (blocks and bytes) and its peak host RSS."""
    kv = runner.context.kv
    return {"rank": rank, "pid": os.getpid(), "steps": steps, "forward_s": forward_s, "comm_s": group.comm_seconds,
            "kv_blocks_total": runner.context.num_blocks,
            "kv_cache_bytes": 0 if kv is None else kv.numel() * kv.element_size(),
            "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}  # Linux: KiB


# A killed rank's sockets close while its process is still exiting: a peer's collective can fail
# before the process is reaped. How long to wait for the dead rank to show, to name it.
DEATH_GRACE_S = 2.0


class RankFailure(RuntimeError):
    """A rank of a tensor-parallel engine died or stopped answering: the engine cannot continue."""


def to_device(meta: AttentionMetadata, device: torch.device) -> AttentionMetadata:
    """The plan's tensors moved to `device` (the host on rank 0 before sending, a worker's device after)."""
    moved = {f.name: getattr(meta, f.name).to(device) for f in dataclasses.fields(meta)
             if isinstance(getattr(meta, f.name), torch.Tensor)}
    return dataclasses.replace(meta, **moved)


@torch.inference_mode()
def forward_step(runner: ModelRunner, ids: torch.Tensor, pos: torch.Tensor, meta: AttentionMetadata,
                 rows: list[int]):
    """The shard's forward over one prepared step (the body of `ModelRunner.execute` after `prepare`):
    (logits [len(rows), V] fp32 or None, the MoE records)."""
    runner.context.meta = meta
    try:
        with only_rows(runner.model, torch.tensor(rows, dtype=torch.long, device=runner.device)):
            out = runner.model(ids, positions=pos, kv_context=runner.context)
    finally:
        runner.context.meta = None
    return (out.logits[0].float() if rows else None), out.moe_records


class ParallelRunner:
    """Rank 0's runner: what `LLMEngine` calls (`execute`, `rows_per_seq`), driving the workers."""

    def __init__(self, runner: ModelRunner, workers, group):
        self.runner, self.workers, self.group = runner, workers, group  # group.comm_seconds: rank 0's collectives
        self.context = runner.context
        self.failure: Optional[str] = None  # once a rank failed, every later step fails at once
        self.steps, self.forward_s = 0, 0.0  # rank 0's own share of `rank_stats`

    @property
    def rows_per_seq(self) -> list[int]:
        return self.runner.rows_per_seq

    def execute(self, batch: ScheduledBatch) -> tuple[Optional[torch.Tensor], list[int], list]:
        if self.failure is not None:
            raise RankFailure(self.failure)
        self._fail_if_dead()
        ids, pos, meta, rows = self.runner.prepare(batch)
        host = torch.device("cpu")
        self.workers.send(("step", ids.to(host), pos.to(host), to_device(meta, host), rows))
        t0 = time.perf_counter()
        try:
            logits, records = forward_step(self.runner, ids, pos, meta, rows)
            self.steps += 1
            self.forward_s += time.perf_counter() - t0
        except Exception as e:  # a collective failed: a peer died or timed out
            self._fail_if_dead(wait_s=DEATH_GRACE_S)
            self.failure = f"a collective of the tensor-parallel step failed: {type(e).__name__}: {e}"
            raise RankFailure(self.failure) from e
        sampled = [i for i, c in enumerate(self.runner.rows_per_seq) if c]
        return logits, sampled, records

    def check_ranks(self) -> Optional[str]:
        """None while every rank runs; else why the engine cannot continue (then it never can)."""
        if self.failure is None:
            try:
                self._fail_if_dead()
            except RankFailure:
                pass
        return self.failure

    def rank_stats(self, timeout_s: float = 30.0) -> list[dict]:
        """Every rank's `rank_stats`, rank 0 first; a RankFailure if a worker is gone or silent."""
        if self.failure is not None:
            raise RankFailure(self.failure)
        mine = rank_stats(0, self.runner, self.group, self.steps, self.forward_s)
        try:
            return [mine] + self.workers.stats(timeout_s)
        except RankFailure as e:
            self.failure = f"{e}; the tensor-parallel engine cannot continue: create it again"
            raise RankFailure(self.failure) from None

    def _fail_if_dead(self, wait_s: float = 0.0) -> None:
        """A RankFailure naming the rank if a worker is dead (`wait_s`: how long to wait for one to be)."""
        deadline = time.monotonic() + wait_s
        while not (dead := self.workers.dead()) and time.monotonic() < deadline:
            time.sleep(0.02)
        if dead:
            self.failure = f"{dead}; the tensor-parallel engine cannot continue: create it again"
            raise RankFailure(self.failure)
