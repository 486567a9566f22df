"""Block tables as persistent tensors: each sequence's `block_table` mirrored into a growing
int32 tensor that is appended in place, and the step's [rows, width] table padded from those.

The block manager keeps `seq.block_table` (a list: the ids it owns) and lowers
`seq.num_synced_blocks` to the entries that stay current whenever it replaces or shortens the
list (admit, free, trim); `sync` then writes only the entries after those. A decode step thus
converts the few blocks allocated since the last step instead of rebuilding every table from
Python lists (at 256 sequences of 128k tokens, 2M list entries a step), and the padding is one
`pad_sequence` copy of the rows.

A sliding-window sequence's released entries (`NULL_BLOCK`, -1: moe.engine.memory.block_manager) are
written as block 0: a valid id, so no kernel indexes outside the cache, and only ever read at
positions the window masks out (a negative id would wrap in torch and read out of bounds in Triton).
"""

from __future__ import annotations

from typing import Sequence as Seq

import torch
from torch.nn.utils.rnn import pad_sequence

from moe.engine.sequence import Sequence


def sync(seq: Sequence) -> torch.Tensor:
    """`seq.block_table` as an int32 tensor [len(block_table)] (a view of the persistent one)."""
    bt, buf, done = seq.block_table, seq.block_table_tensor, seq.num_synced_blocks
    n = len(bt)
    if buf is None or n > buf.numel():
        grown = torch.zeros(max(16, n, 2 * (buf.numel() if buf is not None else 0)), dtype=torch.int32)
        if buf is not None and done:
            grown[:done] = buf[:done]
        seq.block_table_tensor = buf = grown
    if done < n:
        buf[done:n] = torch.tensor(bt[done:n], dtype=torch.int32).clamp_(min=0)  # NULL_BLOCK -> 0
    seq.num_synced_blocks = n
    return buf[:n]


def padded_tables(seqs: Seq[Sequence], widths: Seq[int], pad: int = 0) -> torch.Tensor:
    """[len(seqs), max(widths)] int32: row i = the first widths[i] block ids of seqs[i], then
    `pad` (what the model runner hands the attention backends)."""
    if not seqs:
        return torch.zeros(0, max(widths, default=0), dtype=torch.int32)
    return pad_sequence([sync(s)[:w] for s, w in zip(seqs, widths)], batch_first=True, padding_value=pad)
