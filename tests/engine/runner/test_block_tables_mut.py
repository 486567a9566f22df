"""`sync` / `padded_tables` (moe/engine/runner/block_tables.py) on the edges the random-operation test
leaves out, added for the mutation run of docs/results/mutation/run4_engine/: a table that grows
past its buffer keeps the entries already synced, a first sync far past 16 entries, no sequences."""

from __future__ import annotations

import torch

from moe.engine.runner.block_tables import padded_tables, sync
from moe.engine.sampling.sampler import SamplingParams
from moe.engine.sequence import Sequence


def _seq(blocks: list[int]) -> Sequence:
    seq = Sequence("r", None, [1], SamplingParams(), 0.0)
    seq.block_table = list(blocks)
    return seq


def test_growing_past_the_buffer_keeps_the_synced_entries():
    seq = _seq(list(range(100, 110)))
    assert sync(seq).tolist() == list(range(100, 110))
    seq.block_table += list(range(200, 230))  # 40 entries: the 16-entry buffer grows
    assert sync(seq).tolist() == list(range(100, 110)) + list(range(200, 230))


def test_a_first_sync_of_a_long_table():
    blocks = list(range(7, 47))  # 40 > 16 and > twice nothing
    assert sync(_seq(blocks)).tolist() == blocks


def test_no_sequences_give_an_empty_int32_table():
    for widths, shape in (([], (0, 0)), ([3], (0, 3))):
        got = padded_tables([], widths)
        assert got.dtype == torch.int32 and tuple(got.shape) == shape
