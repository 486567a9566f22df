"""A hybrid model's step metadata: one `AttentionMetadata` per KV cache group.

Group 0's metadata is built from `seq.block_table` as for any model; each other group g takes the
same query layout (decodes, cu_seqlens, context lengths) with its own slot mapping and block
tables, from the sequences' `kv_group_tables[g - 1]` (moe.engine.memory.hybrid_blocks). The
context (moe.engine.runner.context) hands each layer its group's metadata.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence as Seq

import torch

from moe.engine.runner.context import AttentionMetadata


def slots_of(table: list[int], start: int, end: int, block_size: int) -> list[int]:
    """Cache slots of positions start..end-1 in a sequence whose blocks are `table`."""
    out: list[int] = []
    p = start
    while p < end:
        off = p % block_size
        take = min(block_size - off, end - p)
        base = table[p // block_size] * block_size + off
        out.extend(range(base, base + take))
        p += take
    return out


def with_groups(meta: AttentionMetadata, seqs: Seq, spans: Seq[tuple[int, int]], num_groups: int, block_size: int,
                tables: Callable[[list, int, int], torch.Tensor], to_device: Callable,
                extra_slots: Seq[int] = ()) -> AttentionMetadata:
    """`meta` (group 0's) with `groups` set: group g's slots of each sequence's span [start, end)
    then `extra_slots` (padding rows), and its tables `tables(views, lo, hi)` of the decode rows
    (0..num_decodes) and the prefill rows (num_decodes..)."""
    if num_groups < 2:
        return meta
    nd, S = meta.num_decodes, len(seqs)
    groups = [meta]
    for g in range(1, num_groups):
        views = [s.kv_group_tables[g - 1] for s in seqs]
        slots = [x for v, (a, b) in zip(views, spans) for x in slots_of(v.block_table, a, b, block_size)]
        groups.append(dataclasses.replace(
            meta, slot_mapping=to_device(slots + list(extra_slots), torch.int64),
            decode_block_tables=tables(views, 0, min(nd, S)),
            prefill_block_tables=tables(views, min(nd, S), S), groups=None, decode_plan=None))
    meta.groups = groups
    return meta
