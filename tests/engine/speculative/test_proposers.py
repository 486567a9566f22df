"""Proposers (`moe.engine.speculative.proposers`): prompt lookup against a plain search, and the
self-drafting model against the target routed the same way with `set_routing`."""

import copy

import torch

from moe.engine.speculative.proposers import NgramProposer, SelfDraftModel


def naive_lookup(ids, k, max_n, min_n):
    for n in range(max_n, min_n - 1, -1):
        if n >= len(ids):
            continue
        tail = ids[-n:]
        starts = [s for s in range(len(ids) - n) if ids[s:s + n] == tail]
        if starts:
            s = max(starts)
            return ids[s + n:s + n + k]
    return []


def test_ngram_lookup_matches_a_plain_search():
    g = torch.Generator().manual_seed(0)
    p = NgramProposer(3, 1)
    for _ in range(300):
        ids = torch.randint(0, 4, (int(torch.randint(1, 20, (1,), generator=g)),), generator=g).tolist()
        for max_n, min_n in [(3, 1), (2, 2), (4, 2)]:
            assert p.lookup(ids, 3, max_n, min_n) == naive_lookup(ids, 3, max_n, min_n), ids
    assert p.lookup([1, 2, 3, 9, 1, 2, 3], 2, 3, 1) == [9, 1]  # the longest match wins over later shorter ones
    assert p.lookup([5, 6, 7], 2, 3, 1) == []


@torch.no_grad()
def test_self_draft_equals_the_rerouted_target(make_model):
    model = make_model(260, n_layers=3)
    ids = torch.randint(4, 260, (1, 12), generator=torch.Generator().manual_seed(1))
    draft = SelfDraftModel(model, top_k=1, skip_layers=(1,))
    pos = torch.arange(12).unsqueeze(0)
    got = draft(ids, pos, None).logits
    ref = copy.deepcopy(model)
    ref.set_routing(top_k=1)
    del ref.layers[1]
    assert torch.allclose(got, ref(ids).logits, atol=1e-5)
    # the target itself is untouched
    assert model.cfg.router.top_k == 2 and len(model.layers) == 3
    assert torch.allclose(model(ids).logits, copy.deepcopy(model)(ids).logits)
