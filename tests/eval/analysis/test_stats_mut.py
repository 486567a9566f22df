"""eval/analysis/stats.py at its edges, on hand-computed answers: what the sixth mutation run found
the known-answer tests of test_stats.py left open (docs/results/mutation/run6_mutX/README.md).
Every expected value below is worked out in the comment beside it, not read back from the code."""

from __future__ import annotations

import math

import pytest
import torch

from eval.analysis import stats


def mask(rows: list[list[int]], n_experts: int) -> torch.Tensor:
    return stats.masks_of(torch.tensor(rows, dtype=torch.long), n_experts)


# ---------------------------------------------------------------------------- domains

def test_domain_fractions_of_a_one_token_domain_and_an_empty_last_domain():
    # E=3, k=1. Domain 0: tokens -> experts 0, 0, 1 (fractions 2/3, 1/3, 0); domain 1: one token -> expert 2
    # (1.0: a single token is divided by 1, not by a floor above it); domain 2: no tokens (a row of zeros, and
    # the result keeps all n_domains rows although no token names the last domain).
    frac = stats.domain_fractions(mask([[0], [0], [1], [2]], 3), torch.tensor([0, 0, 0, 1]), n_domains=3)
    assert frac.dtype == torch.float64 and frac.shape == (3, 3)
    assert frac.tolist() == [[2 / 3, 1 / 3, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]


def test_expert_domain_share_weights_domains_by_rate_with_exact_values():
    # fractions: expert 0 takes 1/2 of domain 0 and 1/4 of domain 1 -> shares 2/3, 1/3;
    # expert 1 only domain 1 (share 1 there, 0 in domain 0); expert 2 unused: NaN row.
    frac = torch.tensor([[0.5, 0.0, 0.0], [0.25, 0.75, 0.0]], dtype=torch.float64)
    share = stats.expert_domain_share(frac)
    assert share[:2].tolist() == [[2 / 3, 1 / 3], [0.0, 1.0]]
    assert all(math.isnan(v) for v in share[2].tolist())
    score, top = stats.specialization(frac)
    assert score[:2].tolist() == [2 / 3, 1.0] and top[:2].tolist() == [0, 1]
    assert math.isnan(float(score[2]))
    assert frac.tolist() == [[0.5, 0.0, 0.0], [0.25, 0.75, 0.0]]  # the input is not changed


# ---------------------------------------------------------------------------- vocabulary

def test_vocabulary_exact_top_n_fraction_and_ranking_ties():
    # E=2, k=1. Ids: 5 x3 (expert 0 twice, expert 1 once), 6 x2 (expert 0 both), 7 x1 (expert 1).
    # Expert 0: 4 tokens; its top-1 id by count is 5 (2 of 4: 0.5); top tokens by share: 6 (2/2 = 1.0),
    # then 5 (2/3). Expert 1: 2 tokens; ids 5 (1/3) and 7 (1/1): top-1 fraction 1/2 (a tie of counts 1, 1).
    ids = torch.tensor([5, 5, 5, 6, 6, 7])
    out = stats.vocabulary(mask([[0], [0], [1], [0], [0], [1]], 2), ids, top_tokens=2, top_n=1, min_count=1)
    assert out[0] == {"tokens": 4, "top_n_fraction": 0.5,
                      "top_tokens": [{"id": 6, "count": 2, "freq": 2, "share": 1.0},
                                     {"id": 5, "count": 2, "freq": 3, "share": 2 / 3}]}
    assert out[1]["tokens"] == 2 and out[1]["top_n_fraction"] == 0.5
    assert out[1]["top_tokens"] == [{"id": 7, "count": 1, "freq": 1, "share": 1.0},
                                    {"id": 5, "count": 1, "freq": 3, "share": 1 / 3}]
    # top_tokens cuts the list; min_count=2 leaves id 7 (seen once) out; top_n above the vocabulary is the vocabulary
    out = stats.vocabulary(mask([[0], [0], [1], [0], [0], [1]], 2), ids, top_tokens=1, top_n=10, min_count=2)
    assert [t["id"] for t in out[0]["top_tokens"]] == [6] and [t["id"] for t in out[1]["top_tokens"]] == [5]
    assert out[0]["top_n_fraction"] == 1.0 and out[1]["top_n_fraction"] == 1.0
    # equal share and equal count: the smaller id first; an expert with no tokens has no fraction
    out = stats.vocabulary(mask([[0], [0]], 2), torch.tensor([9, 3]), top_tokens=5, top_n=1, min_count=1)
    assert [t["id"] for t in out[0]["top_tokens"]] == [3, 9]
    assert out[1] == {"tokens": 0, "top_n_fraction": None, "top_tokens": []}
    # equal share, different counts: the larger count first (id 4: 2 of 2, id 1: 1 of 1)
    out = stats.vocabulary(mask([[0], [0], [0]], 1), torch.tensor([1, 4, 4]), top_tokens=5, top_n=1, min_count=1)
    assert [t["id"] for t in out[0]["top_tokens"]] == [4, 1] and out[0]["top_n_fraction"] == 2 / 3
    # an expert with a single token: that token is all of it (1.0, not undefined)
    out = stats.vocabulary(mask([[0], [0], [1]], 2), torch.tensor([1, 2, 3]), top_tokens=5, top_n=1, min_count=1)
    assert out[1] == {"tokens": 1, "top_n_fraction": 1.0, "top_tokens": [{"id": 3, "count": 1, "freq": 1, "share": 1.0}]}


# ---------------------------------------------------------------------------- co-activation

def test_coactivation_of_one_token_and_of_no_token():
    # One token choosing experts 0 and 2 of 3: P(0) = P(2) = P(0, 2) = 1 (divided by N = 1), lift 1 / (1 * 1) = 1.
    m = stats.coactivation(mask([[0, 2]], 3))
    assert m["joint"].tolist() == [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 1.0]]
    assert float(m["conditional"][0, 2]) == 1.0 and float(m["lift"][2, 0]) == 1.0
    assert all(math.isnan(float(m[k][1, j])) and math.isnan(float(m[k][j, 1])) for k in ("conditional", "lift")
               for j in range(3))  # expert 1 unused: its row and column
    # Four tokens: P(0) = 3/4, P(1) = 1/2, P(0, 1) = 1/4: conditional(0 -> 1) = 1/3, (1 -> 0) = 1/2,
    # lift = (1/4) / (3/4 * 1/2) = 2/3.
    m = stats.coactivation(mask([[0, 1], [0, 2], [0, 2], [1, 2]], 3))
    assert float(m["joint"][0, 1]) == 0.25 and float(m["joint"][0, 0]) == 0.75
    assert float(m["conditional"][0, 1]) == pytest.approx(1 / 3, abs=1e-15)
    assert float(m["conditional"][1, 0]) == 0.5
    assert float(m["lift"][0, 1]) == pytest.approx(2 / 3, abs=1e-15)
    # No tokens: every probability 0 (no division by zero), the ratios undefined.
    m = stats.coactivation(torch.zeros(0, 2, dtype=torch.bool))
    assert m["joint"].tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert all(math.isnan(v) for row in m["lift"].tolist() for v in row)


def test_uniform_lift_closed_form_and_its_undefined_cases():
    assert stats.uniform_lift(2, 2) == 1.0  # (2-1) * 2 / (2 * 1)
    assert stats.uniform_lift(2, 8) == pytest.approx(8 / 14)  # 1 * 8 / (2 * 7)
    assert stats.uniform_lift(1, 4) == 0.0  # top-1 never picks two experts
    assert stats.uniform_lift(8, 8) == pytest.approx(1.0)  # 7 * 8 / (8 * 7): every expert always chosen
    for k, e in ((1, 1), (2, 1), (0, 4), (-1, 4), (2, 0)):
        assert math.isnan(stats.uniform_lift(k, e))


# ---------------------------------------------------------------------------- agreement

def test_topk_overlap_exact_values_and_no_comparable_token():
    # token 0: {0,1} vs {1,2}: 1 of 2; token 1: {3} vs {3,0}: 1 of min(1, 2) = 1; token 2: {0,1} vs {0,1}: 1, same set.
    a, b = mask([[0, 1], [3, 4], [0, 1]], 4), mask([[1, 2], [3, 0], [0, 1]], 4)
    o = stats.topk_overlap(a, b)
    assert o == {"overlap": pytest.approx(2.5 / 3), "exact": pytest.approx(1 / 3), "tokens": 3}
    assert stats.topk_overlap(b, a)["overlap"] == pytest.approx(2.5 / 3)  # symmetric
    for x, y in ((mask([[4, 4]], 4), mask([[0, 1]], 4)), (mask([[0, 1]], 4), mask([[4, 4]], 4))):
        o = stats.topk_overlap(x, y)  # every slot of A, then of B, dropped: no token to compare
        assert math.isnan(o["overlap"]) and math.isnan(o["exact"]) and o["tokens"] == 0
    with pytest.raises(ValueError, match=r"routings of shapes \(3, 4\) and \(3, 5\) cannot be compared"):
        stats.topk_overlap(a, torch.zeros(3, 5, dtype=torch.bool))


def test_load_total_variation_and_json_values():
    assert stats.load(mask([[1]], 3)).tolist() == [0.0, 1.0, 0.0]  # one assignment is the whole load
    assert stats.load(torch.zeros(2, 3, dtype=torch.bool)).tolist() == [0.0, 0.0, 0.0]  # none: zeros, not NaN
    # unnormalised inputs are normalised first: [1, 3] -> [1/4, 3/4], [2, 2] -> [1/2, 1/2]: TV = 1/4
    assert stats.total_variation([1.0, 3.0], [2.0, 2.0]) == 0.25
    # in float64 throughout: [1/3, 2/3] against [1/2, 1/2] is 1/6 to the last bits (float32 thirds miss by ~1e-8)
    assert stats.total_variation([1.0, 2.0], [1.0, 1.0]) == pytest.approx(1 / 6, rel=1e-15, abs=0)
    assert stats.total_variation([1.0, 1.0], [1.0, 2.0]) == pytest.approx(1 / 6, rel=1e-15, abs=0)
    assert stats.total_variation([0.0, 0.0], [0.0, 0.0]) == 0.0
    # scale-free, also below a total of 1: [0.1, 0.1] is [1/2, 1/2] as [1, 1] is
    assert stats.total_variation([0.1, 0.1], [1.0, 1.0]) == 0.0 and stats.total_variation([1.0, 1.0], [0.1, 0.1]) == 0.0
    assert stats.total_variation(torch.tensor([0.0, 0.0]), torch.tensor([1.0, 0.0])) == 0.5  # zero vector: all 0
    assert stats.finite_or_none(torch.tensor(2.5)) == 2.5 and stats.finite_or_none(3) == 3.0
    assert all(stats.finite_or_none(v) is None for v in (float("nan"), float("inf"), float("-inf")))
    assert stats.matrix_or_none(torch.tensor([[1.0, float("inf")], [float("-inf"), 0.5]])) == [[1.0, None], [None, 0.5]]
