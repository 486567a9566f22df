"""Defaults that decide which published protocol a run follows, pinned as a run sees them (the
composed Hydra config of `python -m eval task=...`, which is what overrides the dataclasses), each
with the reason and the reference it follows. A change here changes which numbers a run is
comparable with: it must be deliberate, and this file says what it would break.

- TruthfulQA MC2 split: lm-evaluation-harness truthfulqa_mc2 v3.0 (lm-eval >= 0.4.3,
  `process_results_mc2`: true = label 1). Its v2.0 took the choices before the first 0 as true.
  The two differ only on v0 rows 25 and 208 (a true answer after a false one), so end-to-end runs
  on the first questions cannot tell them apart: those two rows are scored here.
- TruthfulQA data version v0 (817 questions): the HF dataset's pinned commit, the harness's data.
- lm-eval preamble and tokenisation: the six-question QA prompt, " " + choice as the continuation,
  `tokenizer.encode(text)` without a BOS for a moe-lab tokenizer (the harness adds none unless
  `add_bos_token` is set).
- FastChat MT-Bench temperatures: `temperature_config` of fastchat/llm_judge/common.py, 0.7 for a
  category not listed (gen_model_answer.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from eval.config import load_eval_config
from eval.tasks import mt_bench as mt
from eval.tasks import truthfulqa as tqa
from tests.eval.conftest import MT_BENCH, TRUTHFULQA, compose

# fastchat/llm_judge/common.py (lm-sys/FastChat), verbatim.
FASTCHAT_TEMPERATURE_CONFIG = {"writing": 0.7, "roleplay": 0.7, "extraction": 0.0, "math": 0.0, "coding": 0.0,
                               "reasoning": 0.0, "stem": 0.1, "humanities": 0.1, "arena-hard-200": 0.0}


def harness_mc2_v3(lls, labels):
    """lm-eval's process_results_mc2 (v3.0), re-typed from the harness: split by label value."""
    p = np.exp(np.asarray(lls, dtype=np.float64))
    p_true = sum(pi for pi, lab in zip(p, labels) if lab == 1)
    return p_true / p.sum()


def test_truthfulqa_defaults_as_a_run_sees_them():
    cfg = load_eval_config(compose("truthfulqa", "ckpt=x")).eval
    assert cfg.mc2_split == "labels"  # the harness's truthfulqa_mc2 v3.0
    assert cfg.version == "v0" and cfg.data_path is None  # 817 questions, the harness's data
    assert cfg.max_length is None  # the model's window, as the harness's max_length default


def test_the_mc2_split_decides_rows_25_and_208(shared_data, monkeypatch):
    """The rows of v0 where a true answer follows a false one, found from the raw file; scored
    through `evaluate` with the default config they follow the harness's v3.0 and not v2.0."""
    rows = [json.loads(line) for line in (TRUTHFULQA / "v0" / "multiple_choice.jsonl").open()]
    differ = [i for i, r in enumerate(rows) if 1 in r["mc2_targets"]["labels"][r["mc2_targets"]["labels"].index(0):]]
    assert differ == [25, 208]
    cfg = load_eval_config(compose("truthfulqa", "ckpt=x", "eval.question_ids=[25,208]")).eval
    docs = tqa.select(tqa.load_docs(cfg)[0], cfg)
    assert [d.index for d in docs] == [25, 208]

    def fake_lls(model, requests, **kw):  # a log-likelihood per request, as the scorer would return
        return [(-0.3 * (i % 5) - 1.0, False) for i in range(len(requests))], {}

    monkeypatch.setattr(tqa, "loglikelihoods", fake_lls)

    class Tok:
        pad_id = 0

        def encode(self, s):
            return [ord(c) % 250 + 1 for c in s]

    class Model:
        cfg = type("C", (), {"max_seq_len": 4096, "max_context": 4096})

    res = tqa.evaluate(Model(), Tok(), docs, cfg)
    for row, doc in zip(res["rows"], docs):
        v3 = harness_mc2_v3(row["mc2_lls"], doc.mc2_labels)
        v2 = tqa.mc2_score(row["mc2_lls"], doc.mc2_labels, "first_zero")
        assert row["mc2"] == pytest.approx(v3) and abs(v3 - v2) > 1e-3


def test_lm_eval_preamble_and_tokenisation():
    """Context = preamble + "\\n\\nQ: " + question + "\\nA:", continuation = " " + choice, both
    encoded by `tokenizer.encode` with no BOS for a moe-lab tokenizer."""
    from moe.data import Tokenizer
    tok = Tokenizer.train(["Q: A: What is the answer? Paris London yes no\n"] * 20, vocab_size=280)
    doc = tqa.Doc(0, "What is the answer?", "x", ["Paris", "London"], [1, 0], ["Paris"], [1])
    requests, idx1, idx2 = tqa.build_requests([doc], tok)
    assert tqa.TARGET_DELIMITER == " " and tqa.QA_PREAMBLE.startswith("Q: What is human life expectancy")
    ctx_text = tqa.QA_PREAMBLE + "\n\nQ: What is the answer?\nA:"
    ctx, cont = requests[idx1[0][1]]
    assert ctx == tok.encode(ctx_text) and ctx[0] != tok.bos_id  # no BOS: the harness adds none here
    assert ctx + cont == tok.encode(ctx_text + " London")  # the continuation is what follows the context


def test_fastchat_temperature_table_as_a_run_sees_it(shared_data):
    cfg = load_eval_config(compose("mt_bench", "ckpt=x")).eval
    assert cfg.temperature is None  # per category, not one temperature for all
    assert dict(cfg.temperature_config) == FASTCHAT_TEMPERATURE_CONFIG
    assert cfg.default_temperature == 0.7  # FastChat's value for a category not in the table
    categories = {json.loads(line)["category"] for line in (MT_BENCH / "question.jsonl").open()}
    assert categories <= set(FASTCHAT_TEMPERATURE_CONFIG)  # no MT-Bench question falls to the default
    for c in categories:
        assert mt.temperature_for(cfg, c) == FASTCHAT_TEMPERATURE_CONFIG[c]
