"""Incremental repetition-penalty counts (moe.engine.sampling.penalties) against a recount from scratch,
and the sampler's counts path against its list path (bit-identical logits)."""

import random

import torch

from moe.engine.sampling.penalties import TokenCounts, penalty_context, recount
from moe.engine.sampling.sampler import SamplingParams, apply_repetition_penalty
from moe.engine.sequence import Sequence

V = 50


def test_counts_equal_a_recount_after_random_appends_and_rollbacks():
    rng = random.Random(0)
    seqs = [Sequence(f"s{i}", None, [rng.randrange(V) for _ in range(rng.randrange(1, 30))],
                     SamplingParams(repetition_penalty=1.2), 0.0) for i in range(6)]
    for _ in range(300):
        seq = rng.choice(seqs)
        op = rng.random()
        if op < 0.6:  # decode steps
            seq.token_ids.extend(rng.randrange(V) for _ in range(rng.randrange(1, 4)))
        elif op < 0.7:  # a rollback below what was counted (the engine avoids it; counts must still be right)
            del seq.token_ids[rng.randrange(1, seq.num_tokens + 1):]
        ctx = penalty_context(seq, V, torch.device("cpu"))
        assert torch.equal(ctx.counts_V, recount(seq.token_ids, V))
        assert torch.equal(ctx.seen_V, recount(seq.token_ids, V) > 0)
        assert ctx.num_tokens == seq.num_tokens
    assert penalty_context(Sequence("x", None, [1], SamplingParams(), 0.0), V, torch.device("cpu")) == ()
    seq.finish("stop")
    assert seq.token_counts is None  # released with the request


def test_counts_path_equals_list_path():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, V, generator=g) * 4
    rng = random.Random(1)
    ctxs = [[rng.randrange(V) for _ in range(rng.randrange(0, 80))] for _ in range(7)]
    counts = [TokenCounts(V, torch.device("cpu")).sync(c) for c in ctxs]
    for penalties in ([1.3] * 7, [1.1, 1.0, 0.7, 1.1, 2.0, 1.0, 0.7]):
        want = apply_repetition_penalty(logits, ctxs, penalties)
        assert torch.equal(apply_repetition_penalty(logits, counts, penalties), want)
        mixed = [c if i % 2 else x for i, (c, x) in enumerate(zip(counts, ctxs))]
        assert torch.equal(apply_repetition_penalty(logits, mixed, penalties), want)
        # the plain formula, for the rows with a penalty
        for i, (c, p) in enumerate(zip(ctxs, penalties)):
            ref = logits[i].clone()
            for t in set(c):
                ref[t] = ref[t] / p if ref[t] > 0 else ref[t] * p
            assert torch.allclose(want[i], ref)
    before = logits.clone()
    apply_repetition_penalty(logits, counts, [1.3] * 7)
    assert torch.equal(logits, before)  # the input is left as it is
