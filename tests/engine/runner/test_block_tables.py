"""Persistent block tables (moe.engine.runner.block_tables) and the per-sequence hash chain of the block
manager, against from-scratch constructions after random admit / append / rollback / preempt /
free sequences."""

import random

import torch

from moe.engine.memory.block_manager import BlockManager, hash_block
import moe.engine.memory.block_manager as bm_mod
from moe.engine.runner.block_tables import padded_tables, sync
from moe.engine.sampling.sampler import SamplingParams
from moe.engine.sequence import Sequence

BS = 4


def scratch_tables(seqs, widths, pad=0):
    """The model runner's former construction: Python lists cut to `widths`, padded."""
    width = max(widths, default=0)
    rows = [s.block_table[:w] + [pad] * (width - w) for s, w in zip(seqs, widths)]
    return torch.tensor(rows, dtype=torch.int32).reshape(len(seqs), width)


def scratch_chain(token_ids, n):
    out, parent = [], None
    for i in range(n):
        parent = hash_block(parent, token_ids[i * BS:(i + 1) * BS])
        out.append(parent)
    return out


def scratch_match(bm, seq):
    """BlockManager.match_prefix as it was: re-hash from token 0."""
    ids, hits, parent = seq.token_ids, [], None
    for i in range((len(ids) - 1) // BS):
        toks = ids[i * BS:(i + 1) * BS]
        parent = hash_block(parent, toks)
        bid = bm.hash_to_block.get(parent)
        if bid is None or bm.blocks[bid].token_ids != toks:
            break
        hits.append(bid)
    return hits


def test_tables_and_hashes_equal_scratch_after_random_operations():
    rng = random.Random(0)
    bm = BlockManager(num_blocks=64, block_size=BS)
    shared = [rng.randrange(50) for _ in range(24)]  # common prefixes, so admissions hit the cache
    def new(i):
        return Sequence(f"s{i}", None, shared[:rng.randrange(4, 24)] + [rng.randrange(50) for _ in range(5)],
                        SamplingParams(), 0.0)
    waiting = [new(i) for i in range(8)]
    running: list[Sequence] = []
    checks = 0
    for step in range(400):
        op = rng.random()
        if op < 0.25 and waiting:  # admit
            seq = waiting.pop(0)
            hits = bm.match_prefix(seq)
            assert hits == scratch_match(bm, seq)
            n = seq.num_tokens - len(hits) * BS
            if bm.can_admit(hits, seq.num_tokens):
                bm.admit(seq, hits)
                assert bm.allocate_slots(seq, n)
                seq.num_computed_tokens = seq.num_tokens
                bm.cache_full_blocks(seq)
                running.append(seq)
            else:
                waiting.append(seq)
        elif op < 0.6 and running:  # append tokens (a decode or several)
            seq = rng.choice(running)
            k = rng.randrange(1, 6)
            if bm.allocate_slots(seq, k):
                seq.token_ids.extend(rng.randrange(50) for _ in range(k))
                seq.num_computed_tokens += k
                bm.cache_full_blocks(seq)
        elif op < 0.75 and running:  # proposals computed then rejected: trim, maybe re-grow before a sync
            seq = rng.choice(running)
            k = rng.randrange(1, 9)
            if bm.allocate_slots(seq, k):
                bm.trim(seq, seq.num_computed_tokens)
                if rng.random() < 0.5:
                    bm.allocate_slots(seq, k)
        elif op < 0.85 and running:  # preempt: blocks released, waits again with its tokens
            seq = running.pop(rng.randrange(len(running)))
            bm.free(seq)
            seq.num_computed_tokens = 0
            waiting.insert(0, seq)
        elif running:  # finish; a new request arrives
            seq = running.pop(rng.randrange(len(running)))
            bm.free(seq)
            waiting.append(new(100 + step))
        if running and rng.random() < 0.5:  # the runner reads the tables only at some steps
            seqs = rng.sample(running, rng.randrange(1, len(running) + 1))
            widths = [rng.randrange(0, len(s.block_table) + 1) for s in seqs]
            assert torch.equal(padded_tables(seqs, widths), scratch_tables(seqs, widths))
            assert torch.equal(padded_tables(seqs, [len(s.block_table) for s in seqs], pad=63),
                               scratch_tables(seqs, [len(s.block_table) for s in seqs], pad=63))
            checks += 1
        for s in running:
            assert s.block_hashes == scratch_chain(s.token_ids, len(s.block_hashes))
            assert s.token_hashes == scratch_chain(s.token_ids, len(s.token_hashes))
    assert checks > 100
    for s in running:
        assert sync(s).tolist() == s.block_table
    assert padded_tables([], []).shape == (0, 0)


def test_a_waiting_prompt_is_hashed_once(monkeypatch):
    bm = BlockManager(num_blocks=8, block_size=BS)
    long = Sequence("long", None, list(range(40)), SamplingParams(), 0.0)  # 10 blocks: never fits
    calls = []
    real = bm_mod.hash_block
    monkeypatch.setattr(bm_mod, "hash_block", lambda p, t: calls.append(1) or real(p, t))
    first = Sequence("first", None, list(range(30)) + [99], SamplingParams(), 0.0)
    bm.admit(first, bm.match_prefix(first))
    assert bm.allocate_slots(first, first.num_tokens)
    first.num_computed_tokens = first.num_tokens
    bm.cache_full_blocks(first)  # 7 blocks registered, hashed once
    assert len(calls) == 7  # block 0's hash (the admission's miss) is reused when registering
    calls.clear()
    for _ in range(5):  # admission attempts while it waits: 7 hits, then a miss
        assert len(bm.match_prefix(long)) == 7
        assert not bm.can_admit(bm.match_prefix(long), long.num_tokens + 12)
    assert len(calls) == 8  # hashes of its 7 cached blocks + the 8th, once
