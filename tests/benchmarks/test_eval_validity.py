"""`benchmarks/eval_validity.py`: our TruthfulQA MC1/MC2 against the real lm-evaluation-harness (its Python API, its own task
files pointed at ../shared/data/truthfulqa/v0, no hub access) on a few questions of an exported
model: the same scores, question by question, within float noise."""

from __future__ import annotations

import pytest

from benchmarks.eval_validity import TRUTHFULQA_V0, harness_truthfulqa, ours_truthfulqa
from moe.hf.commands import export_hf
from tests.hf_fixtures import family_checkpoint

pytest.importorskip("lm_eval")


@pytest.mark.slow
def test_truthfulqa_equals_lm_evaluation_harness(tmp_path, monkeypatch):
    from moe.data import Tokenizer

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    text = (TRUTHFULQA_V0 / "TruthfulQA.csv").read_text(encoding="utf-8-sig")[:80_000]
    tok = Tokenizer.train(text.split("\n"), vocab_size=600)
    ckpt = family_checkpoint(tmp_path / "run", tok, vocab_size=640, max_seq_len=1024, qk_norm="head", head_dim=16,
                             dense_layers=[0], dense_hidden=32)
    hf_dir = export_hf(ckpt, tmp_path / "hf")  # a Qwen3-MoE directory
    ours = ours_truthfulqa(hf_dir, limit=6)
    ref = harness_truthfulqa(hf_dir, limit=6, batch_size=8)
    for name in ("mc1", "mc2"):
        assert ours["per_doc"][name].keys() == ref["per_doc"][name].keys() == set(range(6))
        for i, value in ref["per_doc"][name].items():
            assert ours["per_doc"][name][i] == pytest.approx(value, rel=1e-4, abs=1e-6), (name, i)
        assert ours[name] == pytest.approx(ref[name], rel=1e-5, abs=1e-7)
    assert 0 < ours["mc2"] < 1


def test_json_refuses_an_existing_path_before_any_work(tmp_path, capsys):
    from benchmarks.eval_validity import main

    out = tmp_path / "record.json"
    out.write_text("mine", encoding="utf-8")
    assert main([str(tmp_path / "no_such_ckpt"), "--json", str(out)]) == 2
    assert "--json" in capsys.readouterr().err and out.read_text(encoding="utf-8") == "mine"
