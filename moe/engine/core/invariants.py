"""Engine invariants, asserted after every step when `EngineConfig.check_invariants` is on.

A debug hook, off in production (each check walks every block and re-hashes every sequence's
full blocks) and on in the test suite (`tests/conftest.py` sets `MOE_CHECK_INVARIANTS=1`, which
the config's default reads). Bugs of the scheduler or the block manager often leave outputs
right on the examples a test runs (a prefill chunk one token over the budget, a leaked block, a
block registered under the hash of a different parent) and only show as a broken invariant:

- every scheduled batch: at most `max_num_batched_tokens` tokens and `max_num_seqs` sequences,
  each sequence once, each with >= 1 token and no token beyond its end;
- after every step: each block's reference count equals its number of uses in the block tables
  of the live (running or waiting) sequences; no block is both free and used, none is lost (a
  block of reference count 0 is free or evictable, exactly once); every hash in the prefix-cache
  table names a block carrying that hash; the hash recorded for each full block of a sequence, and
  the hash of the cached block its table points to, equal the chained hash of its tokens from the
  start of the sequence; finished (or aborted) requests hold no blocks and are in no queue.
- with a sliding window (every layer slides: moe.engine.memory.kv_groups): a scheduled sequence
  holds every block its step's queries can see (no released entry at or after the first block
  visible from its first new position); after every step the released entries (NULL_BLOCK) are a
  prefix of each table, and each sequence holds at most `max_blocks_held` blocks (its window and
  one step's tokens), so a window that never frees fails here.
- a hybrid model (one block table per KV cache group in one shared pool:
  moe.engine.memory.hybrid_blocks): all of the above for every group's table, each with its
  group's window from the model's config; reference counts over the tables of every group.
"""

from __future__ import annotations

import functools
from collections import Counter

from moe.engine.memory.block_manager import NULL_BLOCK, hash_block


class InvariantError(AssertionError):
    """An engine invariant does not hold: a bug in the engine, never the user's input."""


def _fail(msg: str) -> None:
    raise InvariantError(msg)


def _tables(engine, seq) -> list:
    """(block manager, table holder, window of the model's config) of each of `seq`'s KV cache groups."""
    bm = engine.block_manager
    if not getattr(engine, "hybrid", False):
        return [(bm, seq, engine.sliding_window)]
    return list(zip(bm.groups, bm.views(seq), engine.kv_layout.windows))


def check_batch(engine, batch) -> None:
    """The limits of one scheduled step (read from the config, not from the scheduler: a
    scheduler that misreads its own budget must not also grade itself)."""
    cfg = engine.config
    total = sum(batch.num_new_tokens)
    if total > cfg.max_num_batched_tokens:
        _fail(f"step schedules {total} tokens {batch.num_new_tokens} over max_num_batched_tokens="
              f"{cfg.max_num_batched_tokens}")
    if len(batch.seqs) > cfg.max_num_seqs or len(engine.scheduler.running) > cfg.max_num_seqs:
        _fail(f"{len(batch.seqs)} scheduled / {len(engine.scheduler.running)} running sequences over "
              f"max_num_seqs={cfg.max_num_seqs}")
    if len(batch.seqs) != len(batch.num_new_tokens) or len({id(s) for s in batch.seqs}) != len(batch.seqs):
        _fail("a sequence is scheduled twice, or seqs and num_new_tokens differ in length")
    for seq, n in zip(batch.seqs, batch.num_new_tokens):
        if n < 1 or seq.num_computed_tokens + n > seq.num_tokens:
            _fail(f"{seq!r} scheduled for {n} new tokens")
        for g, (_bm, view, w) in enumerate(_tables(engine, seq)):
            if len(view.block_table) * engine.block_size < seq.num_computed_tokens + n:
                _fail(f"{seq!r} has too few blocks for its {n} new tokens (KV group {g})")
            # (the window's arithmetic redone here, not the block manager's)
            first = 0 if w is None else max(0, seq.num_computed_tokens - w + 1) // engine.block_size
            if NULL_BLOCK in view.block_table[first:]:
                _fail(f"{seq!r} released a block its window still sees (table {view.block_table}, first visible "
                      f"block {first}, KV group {g})")


def check_invariants(engine) -> None:
    """The block manager's and the queues' state between steps (see the module docstring)."""
    bm, sched, bs = engine.block_manager, engine.scheduler, engine.block_size
    live = [*sched.running, *sched.waiting]
    uses = Counter(b for s in live for _m, v, _w in _tables(engine, s) for b in v.block_table if b != NULL_BLOCK)
    free, evictable = list(bm.free_ids), list(bm.evictable)
    if len(set(free)) != len(free) or set(free) & set(evictable):
        _fail("a block is listed twice among the free and evictable blocks")
    unused = set(free) | set(evictable)
    for block in bm.blocks:
        bid = block.block_id
        if block.ref_count != uses[bid]:
            _fail(f"block {bid} has ref_count {block.ref_count} but {uses[bid]} block-table uses")
        if bid in unused and block.ref_count:
            _fail(f"block {bid} is both free and used (ref_count {block.ref_count})")
        if not block.ref_count and bid not in unused:
            _fail(f"block {bid} is unused but neither free nor evictable (leaked)")
        if bid in evictable and block.hash is None:
            _fail(f"evictable block {bid} has no hash (it can never be hit: it should be free)")
    for h, bid in bm.hash_to_block.items():
        if bm.blocks[bid].hash != h:
            _fail(f"the prefix-cache table maps a hash to block {bid}, which carries another")
    for seq in live:
        if seq.is_finished:
            _fail(f"finished {seq!r} is still queued")
        for g, (m, view, w) in enumerate(_tables(engine, seq)):
            _check_hashes(m, seq, view, g, bs)
            _check_window(engine, seq, m, view, w)
    for seq in engine.requests.values():
        if seq.is_finished and any(v.block_table for _m, v, _w in _tables(engine, seq)):
            _fail(f"finished {seq!r} still holds blocks {seq.block_table}")
    if not live and bm.num_used_blocks:
        _fail(f"no request is live but {bm.num_used_blocks} blocks are in use")


def _check_hashes(bm, seq, view, g: int, bs: int) -> None:
    """The hashes recorded for `seq`'s full blocks in group g (`view`), and those of the cached blocks
    its table points to, are the chained hashes of its tokens (under the group's registry key)."""
    if len(view.block_hashes) * bs > seq.num_computed_tokens + seq.num_draft_tokens:
        _fail(f"{seq!r} has {len(view.block_hashes)} hashed blocks but {seq.num_computed_tokens} computed tokens "
              f"(KV group {g})")
    parent = None
    for i, recorded in enumerate(view.block_hashes):
        toks = seq.token_ids[i * bs:(i + 1) * bs]
        parent = hash_block(parent, toks)
        if recorded != parent:
            _fail(f"{seq!r}: block {i}'s recorded hash is not the chained hash of its tokens (KV group {g})")
        if view.block_table[i] == NULL_BLOCK:
            continue
        block = bm.blocks[view.block_table[i]]
        if block.hash is not None and (block.hash != bm.cache_key(parent) or block.token_ids != toks):
            _fail(f"{seq!r}: block {i} (id {block.block_id}) is cached under another prefix's hash (KV group {g})")


def _check_window(engine, seq, bm, view, w) -> None:
    """A sequence's released entries in one group: none without a window, else a prefix of its
    table; and what it holds within the window's bound."""
    table, bs = view.block_table, engine.block_size
    released = table.count(NULL_BLOCK)
    if bm.sliding_window != w:
        _fail(f"the block manager frees by window {bm.sliding_window} but the model's is {w}")
    if w is None:
        if released:
            _fail(f"{seq!r} has released entries but the engine has no sliding window")
        return
    if any(b != NULL_BLOCK for b in table[:released]):
        _fail(f"{seq!r}: released entries are not a prefix of its table {table}")
    # a step of n <= max_num_batched_tokens tokens keeps w - 1 + n positions: at most this many blocks
    bound = -(-(w - 1 + engine.config.max_num_batched_tokens + bs - 1) // bs)
    if len(table) - released > bound:
        _fail(f"{seq!r} holds {len(table) - released} blocks, over the {bound} its window of {w} and one "
              "step need")


def install(engine) -> None:
    """Check every batch `engine.scheduler.schedule` returns and the state after every `step`."""
    schedule, step = engine.scheduler.schedule, engine.step

    @functools.wraps(schedule)
    def checked_schedule():
        batch = schedule()
        check_batch(engine, batch)
        return batch

    @functools.wraps(step)
    def checked_step():
        events = step()
        check_invariants(engine)
        return events

    engine.scheduler.schedule, engine.step = checked_schedule, checked_step
