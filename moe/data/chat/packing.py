"""Conversations -> fixed-length training rows of `seq_len` tokens.

`packing=True` puts conversations back to back in a row (greedy, in order: a conversation that
does not fit starts the next row) and gives each its own segment id and positions restarting
at 0; the model turns the segment ids into a block-diagonal causal mask
(`moe.attention.document_mask`), so no token attends across a conversation boundary. The
unused tail of a row is padding in a segment of its own. `packing=False` puts one conversation
in each row and pads it: plain causal attention is then exact, since padding only follows.

Targets are the next tokens within a conversation (`render.next_token_targets`), already
aligned with the inputs (the trainer's `targets=`), -100 everywhere the loss is off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from moe.data.chat.render import IGNORE_INDEX, next_token_targets


@dataclass
class Example:
    """One rendered conversation: its token ids and their targets (same length)."""

    ids: list[int]
    targets: list[int]

    @classmethod
    def from_mask(cls, ids: Sequence[int], mask: Sequence[bool], seq_len: int) -> "Example":
        """The conversation cut to `seq_len` tokens (its targets recomputed on the cut ids)."""
        ids, mask = list(ids[:seq_len]), list(mask[:seq_len])
        return cls(ids, next_token_targets(ids, mask))

    @property
    def n_loss_tokens(self) -> int:
        return sum(t != IGNORE_INDEX for t in self.targets)


@dataclass
class ChatRows:
    """N rows of T tokens: inputs, targets, positions and (packed only) segment ids, int64."""

    input_ids_NT: torch.Tensor
    targets_NT: torch.Tensor
    positions_NT: torch.Tensor
    segments_NT: Optional[torch.Tensor]  # None when padded: plain causal attention is exact

    def __len__(self) -> int:
        return self.input_ids_NT.shape[0]

    def batch(self, row_idx_B: np.ndarray) -> tuple[torch.Tensor, ...]:
        """(x_BT, y_BT) padded; (x_BT, y_BT, positions_BT, segments_BT) packed."""
        idx = torch.from_numpy(np.asarray(row_idx_B, dtype=np.int64))
        parts = [self.input_ids_NT[idx], self.targets_NT[idx]]
        if self.segments_NT is not None:
            parts += [self.positions_NT[idx], self.segments_NT[idx]]
        return tuple(parts)


def pack_rows(examples: Sequence[Example], seq_len: int, pad_id: int) -> ChatRows:
    """Greedy in-order packing of conversations (each <= seq_len tokens) into rows."""
    rows: list[list[Example]] = [[]]
    used = 0
    for ex in examples:
        if used + len(ex.ids) > seq_len and rows[-1]:
            rows.append([])
            used = 0
        rows[-1].append(ex)
        used += len(ex.ids)
    rows = [r for r in rows if r]
    out = _empty(len(rows), seq_len, pad_id)
    for n, row in enumerate(rows):
        start = 0
        for seg, ex in enumerate(row):
            _place(out, n, start, ex)
            out[3][n, start:start + len(ex.ids)] = seg
            start += len(ex.ids)
        out[3][n, start:] = len(row)  # the padding tail: a segment of its own
        out[2][n, start:] = torch.arange(seq_len - start)
    return ChatRows(*out)


def pad_rows(examples: Sequence[Example], seq_len: int, pad_id: int) -> ChatRows:
    """One conversation per row, padded to seq_len; positions 0..T-1 (the plain causal forward)."""
    ids, targets, positions, _ = _empty(len(examples), seq_len, pad_id)
    for n, ex in enumerate(examples):
        _place((ids, targets, positions), n, 0, ex)
    positions[:] = torch.arange(seq_len)
    return ChatRows(ids, targets, positions, None)


def _empty(n_rows: int, seq_len: int, pad_id: int) -> tuple[torch.Tensor, ...]:
    ids = torch.full((n_rows, seq_len), pad_id, dtype=torch.int64)
    targets = torch.full((n_rows, seq_len), IGNORE_INDEX, dtype=torch.int64)
    return ids, targets, torch.zeros(n_rows, seq_len, dtype=torch.int64), torch.zeros(n_rows, seq_len,
                                                                                      dtype=torch.int64)


def _place(out: Sequence[torch.Tensor], row: int, start: int, ex: Example) -> None:
    end = start + len(ex.ids)
    out[0][row, start:end] = torch.tensor(ex.ids, dtype=torch.int64)
    out[1][row, start:end] = torch.tensor(ex.targets, dtype=torch.int64)
    out[2][row, start:end] = torch.arange(len(ex.ids))


def build_rows(examples: Sequence[Example], seq_len: int, pad_id: int, packing: bool) -> ChatRows:
    return (pack_rows if packing else pad_rows)(examples, seq_len, pad_id)


def forward_inputs(extra_BT: Sequence[torch.Tensor], device=None) -> dict:
    """The model's keyword inputs for a batch's tensors after (x_BT, y_BT): none for text and
    padded chat rows; `positions` and `segments` for packed rows."""
    if not extra_BT:
        return {}
    positions_BT, segments_BT = extra_BT
    return {"positions": positions_BT.to(device), "segments": segments_BT.to(device)}
