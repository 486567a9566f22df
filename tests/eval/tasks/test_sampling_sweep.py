"""Sampling sweep: the metrics on hand examples, the top-p rule equals the engine's, and a real
run writes the table, the PNG and results.json."""

from __future__ import annotations

import json
import math

import pytest
import torch

from eval.tasks.sampling_sweep import entropy_bits, repetition_rate, top_p_mask
from tests.eval.conftest import compose


def test_repetition_rate():
    assert repetition_rate([1, 2, 3, 4, 5]) == 0.0
    assert repetition_rate([1, 2, 3, 1, 2, 3]) == pytest.approx(1 - 3 / 4)  # (1,2,3) repeats once in 4 grams
    assert repetition_rate([7, 7, 7, 7, 7]) == pytest.approx(2 / 3)
    assert repetition_rate([1, 2]) == 0.0


def test_entropy_and_top_p():
    assert float(entropy_bits(torch.full((8,), 1 / 8))) == pytest.approx(3.0)
    assert float(entropy_bits(torch.tensor([1.0, 0.0]))) == 0.0
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    assert top_p_mask(p, 0.5).tolist() == [True, False, False, False]
    assert top_p_mask(p, 0.51).tolist() == [True, True, False, False]
    assert top_p_mask(p, 0.99).tolist() == [True, True, True, True]


def test_top_p_rule_is_the_engines():
    from moe.engine.sampling.sampler import top_k_top_p_min_p_mask

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    for p in (0.3, 0.7, 0.99):
        ref = torch.isfinite(top_k_top_p_min_p_mask(logits, torch.zeros(6, dtype=torch.long),
                                                    torch.full((6,), p), torch.zeros(6)))
        assert torch.equal(top_p_mask(torch.softmax(logits, -1), p), ref)


def test_sweep_run_writes_table_and_plot(tmp_path, tiny_run):
    from eval.__main__ import run_eval

    out = tmp_path / "run"
    res = run_eval(compose("sampling_sweep", f"ckpt={tiny_run}", "logger=none", "eval.top_ps=[0.3,0.99]",
                           "eval.num_samples=3", "eval.max_new_tokens=12"), out)
    rows = res["rows"]
    assert [r["top_p"] for r in rows] == [0.3, 0.99] and all(r["mean_length"] == 12 for r in rows)
    for r in rows:
        assert 0 <= r["sampled_entropy_bits"] <= r["entropy_bits"] + 1e-9 and math.isfinite(r["entropy_bits"])
        assert 0 <= r["repetition_3gram"] <= 1
    assert rows[0]["sampled_entropy_bits"] < rows[1]["sampled_entropy_bits"]
    assert (out / "sampling_sweep.png").stat().st_size > 5000
    saved = json.loads((out / "results.json").read_text())
    assert saved["rows"] == rows and len((out / "samples.jsonl").read_text().splitlines()) == 6


def test_batched_entropies_equal_one_at_a_time(tiny):
    from eval.tasks.sampling_sweep import token_entropies

    model, _, _ = tiny
    samples = [([2], [5, 9, 11, 4]), ([2, 40, 41], [7, 8])]
    batched = token_entropies(model, samples, temperature=1.0, top_p=0.5)
    single = [token_entropies(model, [s], temperature=1.0, top_p=0.5, batch_size=1)[0] for s in samples]
    assert [len(f) for f, _ in batched] == [4, 2]
    for (f1, k1), (f2, k2) in zip(batched, single):
        assert f1 == pytest.approx(f2, abs=1e-5) and k1 == pytest.approx(k2, abs=1e-5)
