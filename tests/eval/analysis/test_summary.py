"""The results.json sections (eval/analysis/summary.py) of hand-made routing records: names,
layer indices and known answers."""

from __future__ import annotations

import pytest
import torch

from eval.analysis import summary
from tests.eval.analysis.conftest import DOMAINS, CharDecoder, make_record


def test_domain_section_names_the_planted_expert(planted):
    dom = summary.domain_section(planted, DOMAINS)
    assert dom["tokens"] == {"code": 12, "stories": 12, "plays": 12} and dom["uniform"] == 0.5
    assert dom["chance_specialization"] == pytest.approx(1 / 3)
    first, second = dom["layers"]
    assert first["layer"] == 1 and second["layer"] == 2  # the model's layer index, not the position
    assert [row[3] for row in first["fractions"]] == [1.0, 0.0, 0.0]
    assert first["specialization"][3] == 1.0 and first["top_domain"][3] == "code"
    assert first["share"][3] == [1.0, 0.0, 0.0]
    # Layer 2 routes every domain alike: no expert prefers one.
    assert second["specialization"] == pytest.approx([1 / 3] * 4) and second["mean_specialization"] == pytest.approx(1 / 3)


def test_vocabulary_section_decodes_the_top_tokens(planted):
    voc = summary.vocabulary_section(planted, CharDecoder(), top_tokens=2, top_n=3, min_count=3)
    first = voc["layers"][0]
    assert voc["uniform_share"] == 0.5 and [ex["expert"] for ex in first["experts"]] == [0, 1, 2, 3]
    assert sum(ex["tokens"] for ex in first["experts"]) == 2 * 36
    expert3 = first["experts"][3]  # all 12 code tokens: ids 0..3, three times each
    assert expert3["tokens"] == 12 and expert3["top_n_fraction"] == pytest.approx(9 / 12)
    assert [(t["id"], t["share"], t["text"]) for t in expert3["top_tokens"]] == [(0, 1.0, "<0>"), (1, 1.0, "<1>")]


def test_coactivation_section(planted):
    co = summary.coactivation_section(planted)
    assert co["uniform_lift"] == pytest.approx(2 / 3)
    first = co["layers"][0]
    # Layer 1: experts 0 and 1 always together outside code: P(1 | 0) = 24/28 and P(0 | 1) = 24/28.
    assert first["conditional"][0][1] == pytest.approx(24 / 28) and first["conditional"][0][0] is None
    lifts = [p["lift"] for p in first["top_pairs"]]
    assert lifts == sorted(lifts, reverse=True)
    # Expert 2 is only ever chosen with expert 3: the highest lift, 1 / P(3) = 3.
    assert first["top_pairs"][0]["experts"] == [2, 3] and first["top_pairs"][0]["lift"] == pytest.approx(3.0)
    top1 = make_record([[[0], [1]]], [0, 1], [5, 6])
    assert "top-k = 1" in summary.coactivation_section(top1)["skipped"]


def test_overlap_by_layer(planted):
    assert summary.overlap_by_layer(planted, planted) == [{"layer": 1, "overlap": 1.0, "exact": 1.0},
                                                          {"layer": 2, "overlap": 1.0, "exact": 1.0}]
    other = make_record([[[0, 1]] * 36, [[2, 3]] * 36], planted.domain_N.tolist(), planted.token_ids_N.tolist(),
                        layers=[1, 2])
    per_layer = summary.overlap_by_layer(other, planted)
    # Layer 2: of the six pairs in turn, {2,3} shares 2 experts, four pairs share 1, {0,1} none.
    assert per_layer[1]["overlap"] == pytest.approx((2 + 4 * 1 + 0) / 6 / 2)
    shuffled = make_record(planted.experts_LNK.tolist(), planted.domain_N.tolist(),
                           list(reversed(planted.token_ids_N.tolist())), layers=[1, 2])
    with pytest.raises(ValueError, match="not of the same tokens"):
        summary.overlap_by_layer(shuffled, planted)


def test_generation_section_known_distances():
    # One domain, one layer, E=4, k=2: four prompt tokens on {0,1} then four generated tokens on {2,3}.
    forced = make_record([[[0, 1]] * 4 + [[2, 3]] * 4], [0] * 8, list(range(8)), generated=[False] * 4 + [True] * 4)
    real = make_record([[[0, 1], [0, 2]]], [0, 0], [1, 2])
    same = summary.generation_section(["code"], [[[0.25, 0.25, 0.25, 0.25]]], forced, real)
    L = same["layers"][0]
    assert L["tv_engine_vs_teacher_forced"] == {"code": 0.0} and same["max_tv_engine_vs_teacher_forced"] == 0.0
    assert L["engine_fractions"] == [[0.5, 0.5, 0.5, 0.5]]  # load x k
    assert L["generated_fractions"] == [[0.0, 0.0, 1.0, 1.0]]
    # Generated load (0, 0, .5, .5) vs real text (.5, .25, .25, 0): TV = (.5 + .25 + .25 + .5) / 2.
    assert L["tv_generated_vs_real"] == {"code": pytest.approx(0.75)}
    off = summary.generation_section(["code"], [[[0.5, 0.5, 0.0, 0.0]]], forced, real)
    assert off["layers"][0]["tv_engine_vs_teacher_forced"] == {"code": 0.5}
    assert torch.equal(forced.select(forced.generated_N).token_ids_N, torch.arange(4, 8))
