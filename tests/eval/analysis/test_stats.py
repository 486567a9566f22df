"""The expert-analysis statistics (eval/analysis/stats.py) on hand-made routing tensors with known
answers, and against plain loops over random routings."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from eval.analysis import stats


def routing(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long)


def random_routing(n: int, n_experts: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, n_experts, generator=g).argsort(dim=1)[:, :k]  # k distinct experts, uniformly


def test_masks_ignore_dropped_slots():
    mask = stats.masks_of(routing([[0, 4], [1, 2], [3, 0]]), n_experts=4)
    assert mask.tolist() == [[True, False, False, False], [False, True, True, False], [True, False, False, True]]


# ---------------------------------------------------------------------------- domains

def test_a_planted_expert_that_sees_one_domain_scores_as_specialised():
    # E=4, k=2, three domains of 12 tokens; expert 3 gets every token of domain 0 and nothing else.
    rows, domain = [], []
    others = list(itertools.combinations([0, 1, 2], 2))
    for d in range(3):
        for i in range(12):
            rows.append([3, i % 3] if d == 0 else list(others[i % 3]))
            domain.append(d)
    mask = stats.masks_of(routing(rows), 4)
    frac = stats.domain_fractions(mask, torch.tensor(domain), 3)
    assert frac.sum(1).tolist() == pytest.approx([2.0, 2.0, 2.0])  # k per token
    assert frac[:, 3].tolist() == [1.0, 0.0, 0.0]
    score, top = stats.specialization(frac)
    assert float(score[3]) == 1.0 and int(top[3]) == 0
    assert all(float(s) < 1.0 for s in score[:3])  # the other experts see every domain
    share = stats.expert_domain_share(frac)
    assert share[3].tolist() == [1.0, 0.0, 0.0] and share.sum(1).tolist() == pytest.approx([1.0] * 4)


def test_domain_fractions_equal_a_loop_and_weight_domains_equally():
    experts = random_routing(300, 6, 2, seed=1)
    domain = torch.randint(0, 3, (300,), generator=torch.Generator().manual_seed(2))
    frac = stats.domain_fractions(stats.masks_of(experts, 6), domain, 3)
    rows, domains = experts.tolist(), domain.tolist()
    for d in range(3):
        toks = [rows[n] for n in range(300) if domains[n] == d]
        for e in range(6):
            assert float(frac[d, e]) == pytest.approx(sum(e in t for t in toks) / len(toks))
    # An expert that takes every token of a small and of a large domain favours neither.
    mask = stats.masks_of(routing([[0, 1]] * 5 + [[0, 2]] * 20), 3)
    score, _ = stats.specialization(stats.domain_fractions(mask, torch.tensor([0] * 5 + [1] * 20), 2))
    assert float(score[0]) == 0.5 and float(score[1]) == 1.0 and float(score[2]) == 1.0


def test_random_routing_is_not_specialised_and_an_unused_expert_has_no_score():
    experts = random_routing(6000, 8, 2, seed=3)
    domain = torch.arange(6000) % 3
    score, _ = stats.specialization(stats.domain_fractions(stats.masks_of(experts, 8), domain, 3))
    assert score.tolist() == pytest.approx([1 / 3] * 8, abs=0.04)
    frac = stats.domain_fractions(stats.masks_of(routing([[0, 1], [1, 0]]), 3), torch.tensor([0, 1]), 2)
    score, _ = stats.specialization(frac)
    assert math.isnan(float(score[2])) and stats.finite_or_none(score[2]) is None


# ---------------------------------------------------------------------------- vocabulary

def test_vocabulary_known_answers():
    # k=1, E=3: token 1 (x4) -> expert 0; token 2 (x4) -> expert 1; token 3 (x4): twice expert 0,
    # twice expert 2; token 9 (once) -> expert 2.
    ids = [1] * 4 + [2] * 4 + [3] * 4 + [9]
    experts = [[0]] * 4 + [[1]] * 4 + [[0], [0], [2], [2]] + [[2]]
    out = stats.vocabulary(stats.masks_of(routing(experts), 3), torch.tensor(ids), top_tokens=5, top_n=1, min_count=2)
    assert [o["tokens"] for o in out] == [6, 4, 3]
    assert out[0]["top_n_fraction"] == pytest.approx(4 / 6) and out[1]["top_n_fraction"] == 1.0
    assert out[2]["top_n_fraction"] == pytest.approx(2 / 3)  # its most frequent id (3) is 2 of its 3 tokens
    assert out[0]["top_tokens"] == [{"id": 1, "count": 4, "freq": 4, "share": 1.0},
                                    {"id": 3, "count": 2, "freq": 4, "share": 0.5}]
    assert out[1]["top_tokens"] == [{"id": 2, "count": 4, "freq": 4, "share": 1.0}]
    assert out[2]["top_tokens"] == [{"id": 3, "count": 2, "freq": 4, "share": 0.5}]  # token 9: seen once, unranked
    top2 = stats.vocabulary(stats.masks_of(routing(experts), 3), torch.tensor(ids), 5, 2, 1)
    assert top2[2]["top_n_fraction"] == 1.0 and [t["id"] for t in top2[2]["top_tokens"]] == [9, 3]


def test_vocabulary_equals_a_loop():
    experts = random_routing(500, 4, 2, seed=4)
    ids = torch.randint(0, 12, (500,), generator=torch.Generator().manual_seed(5))
    out = stats.vocabulary(stats.masks_of(experts, 4), ids, top_tokens=3, top_n=4, min_count=30)
    freq = {v: int((ids == v).sum()) for v in range(12)}
    rows, id_list = experts.tolist(), ids.tolist()
    for e in range(4):
        count = {v: sum(1 for n in range(500) if id_list[n] == v and e in rows[n]) for v in range(12)}
        total = sum(count.values())
        assert out[e]["tokens"] == total
        assert out[e]["top_n_fraction"] == pytest.approx(sum(sorted(count.values())[-4:]) / total)
        ranked = sorted((v for v in range(12) if freq[v] >= 30 and count[v] > 0),
                        key=lambda v: (-count[v] / freq[v], -count[v], v))[:3]
        assert [t["id"] for t in out[e]["top_tokens"]] == ranked
        assert [t["share"] for t in out[e]["top_tokens"]] == pytest.approx([count[v] / freq[v] for v in ranked])


# ---------------------------------------------------------------------------- co-activation

def test_two_experts_always_chosen_together_show_maximal_coactivation():
    m = stats.coactivation(stats.masks_of(routing([[0, 1], [2, 3]] * 10), 4))
    assert float(m["conditional"][0, 1]) == 1.0 and float(m["conditional"][1, 0]) == 1.0
    assert float(m["conditional"][0, 2]) == 0.0 and float(m["lift"][0, 2]) == 0.0
    # P(0) = P(1) = P(0,1) = 1/2: the largest lift two experts with these loads can have, 1 / max(P(i), P(j)).
    assert float(m["lift"][0, 1]) == 2.0 and float(m["joint"][0, 1]) == 0.5 and float(m["joint"][0, 0]) == 0.5
    assert all(math.isnan(float(m[k][i, i])) for k in ("conditional", "lift") for i in range(4))


def test_independent_choices_give_lift_one():
    # One expert of {0, 1} and one of {2, 3}, every combination equally often: across the groups
    # the choices are independent (lift exactly 1); within a group never together (lift 0).
    rows = [[a, b] for a in (0, 1) for b in (2, 3)] * 5
    lift = stats.coactivation(stats.masks_of(routing(rows), 4))["lift"]
    for i, j in itertools.product((0, 1), (2, 3)):
        assert float(lift[i, j]) == pytest.approx(1.0) and float(lift[j, i]) == pytest.approx(1.0)
    assert float(lift[0, 1]) == 0.0 and float(lift[2, 3]) == 0.0
    # Experts drawn independently per token: lift ~1 (sampling noise only).
    g = torch.Generator().manual_seed(6)
    mask = torch.rand(20000, 5, generator=g) < 0.4
    lift = stats.coactivation(mask)["lift"]
    off = lift[~torch.eye(5, dtype=torch.bool)]
    assert off.tolist() == pytest.approx([1.0] * 20, abs=0.06)


def test_coactivation_equals_a_loop_and_the_uniform_baseline():
    experts = random_routing(4000, 6, 3, seed=7)
    m = stats.coactivation(stats.masks_of(experts, 6))
    sets = [set(r.tolist()) for r in experts]
    for i, j in [(0, 1), (2, 5), (4, 3)]:
        both = sum(i in s and j in s for s in sets)
        n_i, n_j = sum(i in s for s in sets), sum(j in s for s in sets)
        assert float(m["conditional"][i, j]) == pytest.approx(both / n_i)
        assert float(m["lift"][i, j]) == pytest.approx((both / 4000) / ((n_i / 4000) * (n_j / 4000)))
    off = m["lift"][~torch.eye(6, dtype=torch.bool)]
    assert float(off.mean()) == pytest.approx(stats.uniform_lift(3, 6), abs=0.03)  # (k-1)E / (k(E-1)) = 0.8
    assert stats.uniform_lift(3, 6) == pytest.approx(0.8)


# ---------------------------------------------------------------------------- agreement

def test_topk_overlap():
    a = stats.masks_of(random_routing(200, 8, 2, seed=8), 8)
    assert stats.topk_overlap(a, a) == {"overlap": 1.0, "exact": 1.0, "tokens": 200}
    o = stats.topk_overlap(stats.masks_of(routing([[0, 1], [0, 1]]), 4), stats.masks_of(routing([[2, 3], [1, 2]]), 4))
    assert o["overlap"] == 0.25 and o["exact"] == 0.0  # token 0: 0 of 2, token 1: 1 of 2
    # A top-1 choice inside the top-2 set counts as full agreement (the reduced model's choices are a subset).
    o = stats.topk_overlap(stats.masks_of(routing([[0], [3]]), 4), stats.masks_of(routing([[0, 1], [2, 1]]), 4))
    assert o["overlap"] == 0.5 and o["exact"] == 0.0
    # Dropped slots are not experts; a token with every slot dropped is left out.
    o = stats.topk_overlap(stats.masks_of(routing([[0, 4], [4, 4]]), 4), stats.masks_of(routing([[0, 1], [0, 1]]), 4))
    assert o == {"overlap": 1.0, "exact": 0.0, "tokens": 1}
    with pytest.raises(ValueError, match="cannot be compared"):
        stats.topk_overlap(a, a[:10])


def test_load_and_total_variation():
    load = stats.load(stats.masks_of(routing([[0, 1], [0, 2]]), 4))
    assert load.tolist() == [0.5, 0.25, 0.25, 0.0]
    assert stats.total_variation(load, load) == 0.0
    assert stats.total_variation(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])) == 1.0
    assert stats.total_variation(torch.tensor([0.5, 0.5, 0, 0]), torch.tensor([0.25, 0.25, 0.25, 0.25])) == 0.5
    assert stats.matrix_or_none(torch.tensor([[1.0, float("nan")]])) == [[1.0, None]]
