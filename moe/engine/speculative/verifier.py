"""The verification half of an engine step with proposals (called by `LLMEngine.step`).

Per drafted sequence: `SpecDecoder.verify` accepts a prefix of its proposals; the sequence is
rolled back to its verified tokens (accepted proposals are kept long enough to register the full
blocks of verified tokens in the prefix cache; `BlockManager.trim` releases the blocks that held
only rejected ones), then the emitted tokens go one by one through the engine's stop checks.
"""

from __future__ import annotations

import time

import torch

from moe.engine.speculative.decoder import logprob_dicts


def verify_drafts(engine, batch, logits, sampled: list[int], events: list):
    """Verify the proposals of the drafted sequences (several logits rows each), roll each back to
    its verified tokens and emit them (events appended to `events`); returns the logits rows and
    batch indices of the other sampled sequences (one row each), for the ordinary sampling path."""
    counts, bm = engine.runner.rows_per_seq, engine.block_manager
    plain_rows, plain, row = [], [], 0
    now = time.perf_counter()
    for i in sampled:
        seq, c = batch.seqs[i], counts[i]
        if not seq.num_draft_tokens:
            plain_rows.append(row)
            plain.append(i)
            row += c
            continue
        lg, row = logits[row:row + c], row + c
        L = seq.num_tokens - seq.num_draft_tokens
        base = seq.num_computed_tokens - batch.num_new_tokens[i]  # = L - 1: the last verified token
        if not bool(torch.isfinite(lg).all()):
            engine.spec.rollback(seq)
            seq.num_computed_tokens = base
            engine._finish(seq, "error", error="the model produced non-finite logits")
            events.append(engine._event(seq))
            continue
        toks, acc = engine.spec.verify(seq, lg)
        # Roll back: keep the accepted proposals (their K/V are right) to hash full blocks of verified
        # tokens only; release the blocks that held nothing but rejected ones.
        del seq.token_ids[L + acc:]
        seq.num_draft_tokens, seq.draft_probs = 0, None
        seq.num_computed_tokens = base + len(toks)
        bm.cache_full_blocks(seq)
        del seq.token_ids[L:]
        lps = logprob_dicts(lg, toks, seq.params.logprobs) if seq.logprobs is not None else [None] * len(toks)
        for tok, lp in zip(toks, lps):  # one by one through the stop checks: a stop ends the request there
            engine._counters["generation_tokens"] += 1
            engine._append_token(seq, tok, lp, now)
            if seq.is_finished:
                break
        if not seq.is_finished:
            bm.trim(seq, seq.num_tokens)
        events.append(engine._event(seq))
    engine.spec.drafted = []
    if len(plain) == len(sampled):
        return logits, sampled
    return (logits[plain_rows] if plain else None), plain
