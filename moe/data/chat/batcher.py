"""Batches of chat rows with `TokenBatcher`'s contract (both are `moe.data.loader.EpochSampler`s):
deterministic, resumable, each rank drawing disjoint rows; and the fixed validation batches."""

from __future__ import annotations

import numpy as np

from moe.data.chat.packing import ChatRows
from moe.data.loader import EpochSampler
from moe.errors import ConfigError


class ChatBatcher(EpochSampler):
    """Batches of rendered chat rows in `EpochSampler`'s order (the rows are the items)."""

    def __init__(self, rows: ChatRows, batch_size: int, seed: int, rank: int = 0, world_size: int = 1):
        if batch_size <= 0:
            raise ValueError(f"batch_size={batch_size} must be > 0")
        super().__init__(len(rows), batch_size, seed, rank, world_size)
        self.rows = rows
        if self.batches_per_epoch == 0:
            raise ConfigError(f"the chat set makes {len(rows)} training rows; one batch needs "
                              f"{batch_size * world_size} (train.batch_size per rank x world size): "
                              "use more conversations or a smaller train.batch_size")

    def next_batch(self) -> tuple:
        return self.rows.batch(self.next_indices())


def chat_eval_batches(rows: ChatRows, batch_size: int, n_batches: int) -> list[tuple]:
    """The first rows of the validation split in order: up to `n_batches` full batches, or one
    smaller batch of every row when there are too few for one."""
    n_full = min(n_batches, len(rows) // batch_size)
    if n_full == 0:
        return [rows.batch(np.arange(len(rows)))]
    return [rows.batch(np.arange(b * batch_size, (b + 1) * batch_size)) for b in range(n_full)]
