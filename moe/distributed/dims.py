"""`ParallelDims`: a frozen description of how a run is laid out over processes, and the few
collectives the training loop needs that depend on nothing else (torchtitan's `ParallelDims`).

`init_distributed` (setup.py) returns one; `parallelize` (parallel.py) turns a model into what
that layout trains and returns what it built. With `distributed=none` every method here is the
single-process behaviour (identity, or the value itself), so a one-process run is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist

from moe.distributed.reduce import mean_over_ranks, reduce_records


@dataclass(frozen=True)
class ParallelDims:
    mode: str  # none | ddp | fsdp | ep
    device: torch.device
    local_batch: int  # sequences per rank per optimizer step (train.batch_size / world_size)
    local_accum: int  # micro-batches per rank per step
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: Optional[str] = None
    ep_size: int = 1
    created_process_group: bool = False

    # ------------------------------------------------------------------ who am I
    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def dp_rank(self) -> int:  # every rank is a data-parallel rank (EP ranks included)
        return self.rank

    @property
    def dp_size(self) -> int:
        return self.world_size

    @property
    def many(self) -> bool:
        """More than one process: collectives are needed."""
        return self.enabled and self.world_size > 1

    # ------------------------------------------------------------------ agreement
    def on_main(self, fn: Callable, *args, **kwargs):
        """Run `fn` on rank 0 and give every rank its result (or raise its exception everywhere)."""
        if not self.many:
            return fn(*args, **kwargs)
        box: list = [None]
        if self.is_main:
            try:
                box[0] = ("ok", fn(*args, **kwargs))
            except Exception as e:  # every rank must raise it, or the others would wait forever
                box[0] = ("error", e)
        dist.broadcast_object_list(box, src=0)
        kind, value = box[0]
        if kind == "error":
            raise value
        return value

    def barrier(self) -> None:
        if self.many:
            dist.barrier()

    # ------------------------------------------------------------------ data
    def shard(self, items: list) -> list:
        """This rank's equal share of `items` (e.g. validation batches), or all of them when
        they do not split evenly (every rank must run the same number of forwards)."""
        if not self.enabled or len(items) % self.world_size != 0:
            return items
        return items[self.rank::self.world_size]

    # ------------------------------------------------------------------ metrics
    def mean(self, *values: float):
        """The mean over ranks of each float (one all-reduce); a float for one value, else a tuple."""
        out = mean_over_ranks(values, self.device) if self.many and values else list(values)
        return out[0] if len(out) == 1 else tuple(out)

    def mean_dict(self, d: dict) -> dict:
        keys = sorted(d)
        values = [d[k] for k in keys]
        return dict(zip(keys, mean_over_ranks(values, self.device) if self.many and values else values))

    def reduce_records(self, records: list) -> list:
        """Routing records of this rank's micro-batch -> the records of the global micro-batch."""
        if not self.many or not records:
            return records
        return reduce_records(records, self.world_size, self.device)

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        if self.enabled and self.created_process_group and dist.is_initialized():
            dist.destroy_process_group()
