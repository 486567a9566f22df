"""Batches of chat rows with `TokenBatcher`'s contract: deterministic, resumable, per rank.

Every epoch permutes the rows with `np.random.default_rng((seed, epoch))`; batch b of an epoch
is, for rank r, the rows at permutation positions `[b*B*W + r*B, b*B*W + (r+1)*B)`, so ranks
draw disjoint rows and `state_dict()` / `load_state_dict()` resume the exact batch sequence.
"""

from __future__ import annotations

import numpy as np

from moe.data.chat.packing import ChatRows
from moe.errors import ConfigError


class ChatBatcher:
    def __init__(self, rows: ChatRows, batch_size: int, seed: int, rank: int = 0, world_size: int = 1):
        if batch_size <= 0:
            raise ValueError(f"batch_size={batch_size} must be > 0")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        self.rows, self.batch_size, self.seed = rows, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.batches_per_epoch = len(rows) // (batch_size * world_size)
        if self.batches_per_epoch == 0:
            raise ConfigError(f"the chat set makes {len(rows)} training rows; one batch needs "
                              f"{batch_size * world_size} (train.batch_size per rank x world size): "
                              "use more conversations or a smaller train.batch_size")
        self.epoch = self.batch_in_epoch = 0

    def next_batch(self) -> tuple:
        if self.batch_in_epoch >= self.batches_per_epoch:
            self.epoch += 1
            self.batch_in_epoch = 0
        b, B = self.batch_in_epoch, self.batch_size
        start = b * B * self.world_size + self.rank * B
        perm_N = np.random.default_rng((self.seed, self.epoch)).permutation(len(self.rows))
        self.batch_in_epoch += 1
        return self.rows.batch(perm_N[start:start + B])

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def load_state_dict(self, state: dict) -> None:
        epoch, b = int(state["epoch"]), int(state["batch_in_epoch"])
        if epoch < 0 or not 0 <= b <= self.batches_per_epoch:
            raise ValueError(f"bad batcher state {state}: batch_in_epoch must be in "
                             f"[0, {self.batches_per_epoch}] and epoch >= 0")
        self.epoch, self.batch_in_epoch = epoch, b


def chat_eval_batches(rows: ChatRows, batch_size: int, n_batches: int) -> list[tuple]:
    """The first rows of the validation split in order: up to `n_batches` full batches, or one
    smaller batch of every row when there are too few for one."""
    n_full = min(n_batches, len(rows) // batch_size)
    if n_full == 0:
        return [rows.batch(np.arange(len(rows)))]
    return [rows.batch(np.arange(b * batch_size, (b + 1) * batch_size)) for b in range(n_full)]
