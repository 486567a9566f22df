"""Batches of (input, target) token windows from a flat token array.

The stream is cut into non-overlapping windows of `seq_len + 1` tokens (x = window[:-1],
y = window[1:]). Training visits the windows in a fresh permutation each epoch; which
batch comes next is a pure function of (seed, epoch, batch_in_epoch, rank, world_size),
so a batcher restored from `state_dict()` continues exactly where the saved one stopped.
"""

from __future__ import annotations

import numpy as np
import torch


def _windows(tokens: np.ndarray, window_idx_B: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_BT, y_BT) int64 tensors for the given window indices."""
    starts_B = window_idx_B.astype(np.int64) * (seq_len + 1)
    offsets_W = np.arange(seq_len + 1, dtype=np.int64)
    # Fancy indexing reads just these windows from a memmap; astype copies into RAM as int64.
    win_BW = np.asarray(tokens[starts_B[:, None] + offsets_W[None, :]]).astype(np.int64)
    win_BW = torch.from_numpy(win_BW)
    return win_BW[:, :-1].contiguous(), win_BW[:, 1:].contiguous()


class EpochSampler:
    """The deterministic, resumable order of a training set's items, each rank drawing its own share.

    Every epoch permutes the item indices with `np.random.default_rng((seed, epoch))` (computed
    once per epoch). Batch b of an epoch is, for rank r, the items at permutation positions
    `[b*B*W + r*B, b*B*W + (r+1)*B)` (B = batch_size, W = world_size): the ranks' batches are
    disjoint, and an epoch holds `n_items // (B*W)` batches (the remainder is skipped so every
    rank takes the same number of steps). `state_dict()` / `load_state_dict()` resume the exact
    sequence. `TokenBatcher` (windows of a token stream) and the chat batcher (rendered rows) build
    their batches from `next_indices()`.
    """

    def __init__(self, n_items: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        self.n_items, self.batch_size, self.seed = n_items, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.batches_per_epoch = n_items // (batch_size * world_size)
        self.epoch = 0
        self.batch_in_epoch = 0
        self._perm_epoch = -1
        self._perm_N = np.empty(0, dtype=np.int64)

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:  # one permutation per epoch, computed once
            self._perm_N = np.random.default_rng((self.seed, epoch)).permutation(self.n_items)
            self._perm_epoch = epoch
        return self._perm_N

    def next_indices(self) -> np.ndarray:
        """This rank's item indices for the next batch (moving to the next epoch when one ends)."""
        if self.batch_in_epoch >= self.batches_per_epoch:
            self.epoch += 1
            self.batch_in_epoch = 0
        b, B = self.batch_in_epoch, self.batch_size
        start = b * B * self.world_size + self.rank * B
        idx_B = self._permutation(self.epoch)[start:start + B]
        self.batch_in_epoch += 1
        return idx_B

    def state_dict(self) -> dict:
        """Where the next batch comes from: restoring it resumes the exact batch sequence."""
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def load_state_dict(self, state: dict) -> None:
        epoch, b = int(state["epoch"]), int(state["batch_in_epoch"])
        if epoch < 0 or not 0 <= b <= self.batches_per_epoch:
            raise ValueError(f"bad batcher state {state}: batch_in_epoch must be in "
                             f"[0, {self.batches_per_epoch}] and epoch >= 0")
        self.epoch, self.batch_in_epoch = epoch, b


class TokenBatcher(EpochSampler):
    """Training batches of `seq_len + 1`-token windows of a token stream, in `EpochSampler`'s
    order (the windows are the items)."""

    def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int, seed: int,
                 rank: int = 0, world_size: int = 1):
        if batch_size <= 0 or seq_len <= 0:
            raise ValueError(f"batch_size={batch_size} and seq_len={seq_len} must be > 0")
        super().__init__(len(tokens) // (seq_len + 1), batch_size, seed, rank, world_size)
        self.tokens, self.seq_len = tokens, seq_len
        self.n_windows = self.n_items
        if self.batches_per_epoch == 0:
            need = batch_size * world_size * (seq_len + 1)
            raise ValueError(
                f"the token stream has {len(tokens)} tokens; one batch needs {need} "
                f"(batch_size={batch_size} x world_size={world_size} x (seq_len={seq_len} + 1)); "
                "use more data or a smaller batch_size / seq_len")

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next (x_BT, y_BT): int64, y_BT[:, t] = the token after x_BT[:, t]."""
        return _windows(self.tokens, self.next_indices(), self.seq_len)

    def __iter__(self):
        while True:
            yield self.next_batch()


def eval_batches(tokens: np.ndarray, batch_size: int, seq_len: int, n_batches: int
                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed list of evaluation batches: the first windows of the split, in order.

    Up to `n_batches` full batches; a split too short for one full batch gives a single
    smaller batch of all its windows. Same tokens, same batches, every call.
    """
    if batch_size <= 0 or seq_len <= 0 or n_batches <= 0:
        raise ValueError(f"batch_size={batch_size}, seq_len={seq_len}, n_batches={n_batches} must be > 0")
    n_windows = len(tokens) // (seq_len + 1)
    if n_windows == 0:
        raise ValueError(f"the validation split has {len(tokens)} tokens; one sequence needs "
                         f"seq_len + 1 = {seq_len + 1}; use more data, a larger data.val_fraction "
                         "or a smaller seq_len")
    n_full = min(n_batches, n_windows // batch_size)
    if n_full == 0:
        return [_windows(tokens, np.arange(n_windows), seq_len)]
    return [_windows(tokens, np.arange(b * batch_size, (b + 1) * batch_size), seq_len) for b in range(n_full)]
