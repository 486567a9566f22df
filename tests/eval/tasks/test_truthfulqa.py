"""TruthfulQA MC1/MC2: the harness protocol (prompt, tokenisation, truncation, metrics), batched
scores equal a slow per-choice reference and the harness's computation on our HF export,
subsets pick what they say, and the CLI writes results.json and a W&B run."""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from eval.loglik import encode_pair, loglikelihoods, model_window, reference_loglikelihood
from eval.tasks.truthfulqa import (QA_PREAMBLE, Doc, TruthfulQAConfig, build_requests, doc_to_text, evaluate,
                                   load_docs, mc1_score, mc2_score, select)

from tests.eval.conftest import REPO, TRUTHFULQA, compose


# ---------------------------------------------------------------------------- protocol

def test_prompt_is_the_harness_preamble_and_question_format():
    text = doc_to_text("Is the sky blue?")
    assert text.startswith("Q: What is human life expectancy in the United States?\n"
                           "A: Human life expectancy in the United States is 78 years.\n\nQ: Who was president")
    assert text.endswith("A: The 1992 Olympics were held in Barcelona, Spain.\n\nQ: Is the sky blue?\nA:")
    assert text == QA_PREAMBLE + "\n\nQ: Is the sky blue?\nA:"
    assert text.count("\nA: ") == 6 and text.count("Q: ") == 7 and "\n\n\n" not in text


class CharTokenizer:
    """One token per character (ids = code points): makes boundaries easy to check."""

    def encode(self, s):
        return [ord(c) for c in s]


class MergingTokenizer:
    """Merges ' b' into one token, so a token straddles a context ending in a space."""

    def encode(self, s):
        out, i = [], 0
        while i < len(s):
            if s[i:i + 2] == " b":
                out.append(1000)
                i += 2
            else:
                out.append(ord(s[i]))
                i += 1
        return out


def test_encode_pair_moves_trailing_spaces_and_splits_at_the_context_length():
    ctx, cont = encode_pair(CharTokenizer(), "A:", " yes")
    assert ctx == [ord("A"), ord(":")] and cont == [ord(c) for c in " yes"]
    # A context ending in spaces: the spaces go to the continuation (the harness's _encode_pair).
    ctx, cont = encode_pair(MergingTokenizer(), "a  ", "b")
    assert ctx == [ord("a")] and cont == [ord(" "), 1000]
    ctx, cont = encode_pair(CharTokenizer(), "A: ", "yes")  # one trailing space moves too
    assert ctx == [ord("A"), ord(":")] and cont == [ord(c) for c in " yes"]
    # The continuation is whatever follows len(encode(context)) in encode(context + continuation).
    ctx, cont = encode_pair(MergingTokenizer(), "xa", " bc")
    assert cont == [1000, ord("c")]


def test_model_window_left_truncates_like_the_harness():
    assert model_window([1, 2, 3], [4, 5], max_length=10) == [1, 2, 3, 4]
    assert model_window([1, 2, 3], [4, 5], max_length=3) == [2, 3, 4]


def test_mc2_default_split_and_the_first_zero_edges():
    """The default split is the harness's mc2 v3.0 (`labels`); `first_zero` with no 0 label counts
    every choice true, and with a leading 0 none (rules out testing for a 1 instead of a 0)."""
    lls, labels = [-1.0, -2.0, -0.5], [1, 0, 1]
    assert mc2_score(lls, labels) == mc2_score(lls, labels, "labels") != mc2_score(lls, labels, "first_zero")
    assert mc2_score(lls, [1, 1, 1], "first_zero") == pytest.approx(1.0)
    assert mc2_score(lls, [0, 1, 1], "first_zero") == 0.0


def test_mc1_and_mc2_on_hand_examples():
    assert mc1_score([-1.0, -2.0, -0.5], [1, 0, 0]) == 0.0
    assert mc1_score([-0.5, -2.0, -0.5], [1, 0, 0]) == 1.0  # ties: the first (np.argmax)
    p = [0.2, 0.1, 0.3, 0.4]
    assert mc2_score(np.log(p), [1, 1, 0, 0]) == pytest.approx(0.3)
    # Normalised over all choices: the probabilities need not sum to one.
    assert mc2_score(np.log([0.1, 0.1, 0.2]), [1, 0, 0]) == pytest.approx(0.25)
    assert mc2_score(np.log([0.01, 0.02, 0.01]), [1, 1, 0]) == pytest.approx(0.75)
    # The harness's mc2 v3.0 uses the labels; its v2.0 took the choices before the first 0 as true.
    lls = np.log([0.1, 0.2, 0.3, 0.4])
    assert mc2_score(lls, [1, 0, 1, 0], "first_zero") == pytest.approx(0.1)
    assert mc2_score(lls, [1, 0, 1, 0], "labels") == pytest.approx(0.4)
    # Log-likelihoods so small that exp underflows still normalise.
    assert mc2_score([-2000.0, -2000.0 - math.log(3)], [1, 0]) == pytest.approx(0.75)


# ---------------------------------------------------------------------------- data and subsets

def test_data_layouts_and_versions(tmp_path, shared_data):
    docs, info = load_docs(TruthfulQAConfig())
    assert len(docs) == 817 and info["source"].endswith("v0/multiple_choice.jsonl") and info["has_categories"]
    assert docs[0].question.startswith("What is the smallest country in the world")
    assert docs[0].mc1_labels[0] == 1 and sum(docs[0].mc1_labels) == 1
    assert len({d.category for d in docs}) == 38 and "unknown" not in {d.category for d in docs}
    # The original repository's layout (mc_task.json + TruthfulQA.csv) gives the same questions.
    (tmp_path / "orig").mkdir()
    for name in ("mc_task.json", "TruthfulQA.csv"):
        os.symlink(TRUTHFULQA / "v0" / name, tmp_path / "orig" / name)
    orig, info2 = load_docs(TruthfulQAConfig(data_path=str(tmp_path / "orig")))
    assert info2["source"].endswith("mc_task.json")
    assert [(d.question, d.category, d.mc1_choices, d.mc2_choices, d.mc2_labels) for d in orig] == \
           [(d.question, d.category, d.mc1_choices, d.mc2_choices, d.mc2_labels) for d in docs]
    new, _ = load_docs(TruthfulQAConfig(version="2025"))
    assert len(new) == 790 and "Indexical Error: Time" not in {d.category for d in new}


def test_loading_does_not_depend_on_the_locale_encoding(tmp_path, shared_data):
    """The data files are UTF-8 and hold non-ASCII questions; on a machine whose locale encoding is
    ASCII (LC_ALL=C without Python's UTF-8 coercion) both file layouts load the same docs as here
    (rules out opening them with the locale's encoding)."""
    (tmp_path / "orig").mkdir()
    os.symlink(TRUTHFULQA / "v0" / "TruthfulQA.csv", tmp_path / "orig" / "TruthfulQA.csv")
    # the shared mc_task.json is ASCII (\u escapes); the same rows written as raw UTF-8 are valid JSON too
    rows = json.loads((TRUTHFULQA / "v0" / "mc_task.json").read_text(encoding="utf-8"))
    (tmp_path / "orig" / "mc_task.json").write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    assert not (tmp_path / "orig" / "mc_task.json").read_bytes().isascii()
    script = ("import json, locale, sys\n"
              "from eval.tasks.truthfulqa import TruthfulQAConfig, load_docs\n"
              "assert locale.getpreferredencoding(False) == 'ANSI_X3.4-1968', locale.getpreferredencoding(False)\n"
              "out = {p: [[d.question, d.category, d.mc2_choices] for d in load_docs(TruthfulQAConfig(data_path=p))[0]]\n"
              "       for p in sys.argv[1:]}\n"
              "sys.stdout.buffer.write(json.dumps(out).encode())\n")
    paths = [str(TRUTHFULQA / "v0"), str(tmp_path / "orig")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHONUTF8"))}
    env.update(LC_ALL="C", PYTHONCOERCECLOCALE="0", PYTHONUTF8="0")
    p = subprocess.run([sys.executable, "-c", script, *paths], cwd=REPO, env=env, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    got = json.loads(p.stdout)
    ref = [[d.question, d.category, d.mc2_choices] for d in load_docs(TruthfulQAConfig())[0]]
    assert any(not q.isascii() for q, _, choices in ref for q in [q, *choices])
    assert got == {paths[0]: ref, paths[1]: ref}


def test_the_hub_parquet_layout_gives_the_same_questions(tmp_path, shared_data):
    """A directory holding the hub's parquet snapshot (`.../validation-*.parquet`, no categories)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = [json.loads(line) for line in (TRUTHFULQA / "v0" / "multiple_choice.jsonl").read_text().splitlines()]
    (tmp_path / "snap" / "multiple_choice").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "snap" / "multiple_choice" / "validation-00000-of-00001.parquet")
    docs, info = load_docs(TruthfulQAConfig(data_path=str(tmp_path / "snap")))
    ref, _ = load_docs(TruthfulQAConfig())
    assert info["source"] == str(tmp_path / "snap" / "multiple_choice") and not info["has_categories"]
    assert [(d.question, d.mc1_choices, d.mc1_labels, d.mc2_choices, d.mc2_labels) for d in docs] == \
           [(d.question, d.mc1_choices, d.mc1_labels, d.mc2_choices, d.mc2_labels) for d in ref]
    assert {d.category for d in docs} == {"unknown"}


def test_targets_and_categories_are_read_as_written(tmp_path):
    """mc_task.json's {choice: label} even when a choice is the word "labels" (only a dict with both
    "choices" and "labels" is the hub's form); a CSV with a BOM before its first column, and a quoted
    question with an embedded CRLF kept as written (the csv module's newline="")."""
    from eval.tasks.truthfulqa import _categories, _targets
    assert _targets({"labels": 1, "other": 0}) == (["labels", "other"], [1, 0])
    assert _targets({"choices": ["a", "b"], "labels": [0, 1]}) == (["a", "b"], [0, 1])
    csv_path = tmp_path / "TruthfulQA.csv"
    csv_path.write_bytes("\ufeffQuestion,Category\r\nWhat is x?,Health\r\n\"Two\r\nlines?\",Law\r\n".encode("utf-8"))
    assert _categories(csv_path) == {"What is x?": "Health", "Two\r\nlines?": "Law"}


def test_the_hub_route_asks_for_the_multiple_choice_validation_split(monkeypatch, shared_data):
    """`eval.data_path=hub`: `datasets.load_dataset(hub_name, "multiple_choice", split="validation")`
    (stood in for here by the local copy of the same rows: no network), categories from the local
    v0 CSV, and a failure of the hub as an EvalError saying what could not be loaded."""
    import datasets
    from eval.common import EvalError
    rows = [json.loads(line) for line in (TRUTHFULQA / "v0" / "multiple_choice.jsonl").read_text().splitlines()]
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append((a, k)) or rows)
    docs, info = load_docs(TruthfulQAConfig(data_path="hub"))
    ref, ref_info = load_docs(TruthfulQAConfig())
    assert calls == [(("truthfulqa/truthful_qa", "multiple_choice"), {"split": "validation"})]
    assert info == {"source": "hub:truthfulqa/truthful_qa/multiple_choice/validation", "n_total": 817,
                    "has_categories": True, "version": None}
    assert [(d.question, d.category, d.mc2_labels) for d in docs] == [(d.question, d.category, d.mc2_labels) for d in ref]
    assert ref_info == {"source": str(TRUTHFULQA / "v0" / "multiple_choice.jsonl"), "n_total": 817,
                        "has_categories": True, "version": "v0"}

    def offline(*a, **k):
        raise ConnectionError("no network")
    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(EvalError) as e:
        load_docs(TruthfulQAConfig(data_path="hub"))
    assert str(e.value) == ("could not load 'truthfulqa/truthful_qa' (multiple_choice, validation) from the hub: "
                            "ConnectionError: no network")


def test_local_data_errors_and_unknown_categories(tmp_path):
    from eval.common import EvalError
    with pytest.raises(EvalError) as e:
        load_docs(TruthfulQAConfig(data_path=str(tmp_path)))
    assert str(e.value) == (f"eval.data_path={str(tmp_path)!r} holds no TruthfulQA data: expected mc_task.json "
                            "(the original repository), multiple_choice.jsonl or validation-*.parquet (the hub layout)")
    (tmp_path / "f.json").write_text("{}")
    with pytest.raises(EvalError) as e:
        load_docs(TruthfulQAConfig(data_path=str(tmp_path / "f.json")))
    assert str(e.value) == f"eval.data_path (TruthfulQA): {str(tmp_path / 'f.json')!r} is not a directory"
    good = {"question": "Known?", "mc1_targets": {"choices": ["a"], "labels": [1]},
            "mc2_targets": {"choices": ["a", "b"], "labels": [1, 0]}}
    lines = [good, {**good, "question": "Not in the CSV?"}, {"question": "Bad?", "mc2_targets": {}}]
    (tmp_path / "multiple_choice.jsonl").write_text("\n".join(json.dumps(r) for r in lines[:2]) + "\n")
    (tmp_path / "TruthfulQA.csv").write_text("Question,Category\nKnown?,Health\n")
    docs, info = load_docs(TruthfulQAConfig(data_path=str(tmp_path)))
    assert [d.category for d in docs] == ["Health", "unknown"] and info["version"] is None
    (tmp_path / "multiple_choice.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    with pytest.raises(EvalError) as e:
        load_docs(TruthfulQAConfig(data_path=str(tmp_path)))
    assert str(e.value) == (f"{tmp_path / 'multiple_choice.jsonl'}: row 2 is not a TruthfulQA multiple-choice row "
                            "(KeyError: 'mc1_targets')")


def test_subsets_pick_what_they_say():
    docs, _ = load_docs(TruthfulQAConfig())
    first = select(docs, TruthfulQAConfig(limit=5))
    assert [d.index for d in first] == [0, 1, 2, 3, 4]
    health = select(docs, TruthfulQAConfig(categories=["Health"], limit=3))
    all_health = [d.index for d in docs if d.category == "Health"]
    assert [d.index for d in health] == all_health[:3] and len(all_health) == 55
    picked = select(docs, TruthfulQAConfig(question_ids=[10, 3, 700]))
    assert [d.index for d in picked] == [3, 10, 700]  # file order
    a = select(docs, TruthfulQAConfig(shuffle=True, seed=1, limit=10))
    b = select(docs, TruthfulQAConfig(shuffle=True, seed=1, limit=10))
    c = select(docs, TruthfulQAConfig(shuffle=True, seed=2, limit=10))
    assert [d.index for d in a] == [d.index for d in b] != [d.index for d in c]
    from eval.common import EvalError
    with pytest.raises(EvalError, match="not in the data"):
        select(docs, TruthfulQAConfig(categories=["Nope"]))
    with pytest.raises(EvalError, match="out of range"):
        select(docs, TruthfulQAConfig(question_ids=[817]))


# ---------------------------------------------------------------------------- scores

@pytest.mark.parametrize("max_length", [None, 1024], ids=["truncated-to-model-length", "untruncated"])
def test_batched_scores_equal_a_slow_per_choice_reference(tiny, max_length):
    model, tok, _ = tiny
    docs, _ = load_docs(TruthfulQAConfig())
    docs = docs[:3]
    cfg = TruthfulQAConfig(batch_size=5, max_length=max_length)  # odd batch: mixed lengths and padding
    res = evaluate(model, tok, docs, cfg)
    L = max_length or model.cfg.max_seq_len
    assert res["stats"]["max_length"] == L
    assert (res["stats"]["truncated_requests"] > 0) == (max_length is None)
    slow = {}  # one forward per distinct choice (mc1's choices reappear in mc2)
    for d, row in zip(docs, res["rows"]):
        ctx = doc_to_text(d.question)
        for choices, lls in ((d.mc1_choices, row["mc1_lls"]), (d.mc2_choices, row["mc2_lls"])):
            for c in choices:
                if (ctx, c) not in slow:
                    slow[ctx, c] = reference_loglikelihood(model, *encode_pair(tok, ctx, " " + c), max_length=L)
            np.testing.assert_allclose(lls, [slow[ctx, c] for c in choices], atol=2e-4, rtol=0)
        assert row["mc1"] == mc1_score(row["mc1_lls"], d.mc1_labels)
        assert row["mc2"] == pytest.approx(mc2_score(row["mc2_lls"], d.mc2_labels))
    assert res["scores"]["mc1"] == pytest.approx(np.mean([r["mc1"] for r in res["rows"]]))
    assert res["scores"]["mc2_stderr"] == pytest.approx(np.std([r["mc2"] for r in res["rows"]], ddof=1) / 3 ** 0.5)


def test_the_harness_computation_on_our_hf_export_gives_the_same_scores(tiny, tiny_hf):
    """lm-evaluation-harness's HFLM steps, written out over the transformers model and tokenizer
    loaded from our export: AutoTokenizer.encode(add_special_tokens=False), _encode_pair,
    left truncation to max_position_embeddings, log_softmax, sum over the continuation."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok, _ = tiny
    hf_tok = AutoTokenizer.from_pretrained(tiny_hf)
    hf_model = AutoModelForCausalLM.from_pretrained(tiny_hf).eval()
    max_length = hf_model.config.max_position_embeddings
    docs, _ = load_docs(TruthfulQAConfig())
    docs = docs[:2]

    class HarnessTok:
        def encode(self, s):
            return hf_tok.encode(s, add_special_tokens=False)

    harness_requests, _, _ = build_requests(docs, HarnessTok())
    ours_requests, _, _ = build_requests(docs, tok)
    assert harness_requests == ours_requests  # identical tokenisation at every boundary

    @functools.lru_cache(maxsize=None)
    def harness_ll(ctx, cont):
        ctx, cont = list(ctx), list(cont)
        inp = torch.tensor([(ctx + cont)[-(max_length + 1):][:-1]])
        with torch.no_grad():
            logits = torch.log_softmax(hf_model(inp).logits, dim=-1)[0]
        inplen, contlen = inp.shape[1], len(cont)
        sel = logits[inplen - contlen:inplen]
        return float(torch.gather(sel, 1, torch.tensor(cont).unsqueeze(1)).sum())

    res = evaluate(model, tok, docs, TruthfulQAConfig())
    for d, row in zip(docs, res["rows"]):
        ctx = doc_to_text(d.question)
        h1 = [harness_ll(*map(tuple, encode_pair(HarnessTok(), ctx, " " + c))) for c in d.mc1_choices]
        h2 = [harness_ll(*map(tuple, encode_pair(HarnessTok(), ctx, " " + c))) for c in d.mc2_choices]
        np.testing.assert_allclose(row["mc1_lls"], h1, atol=2e-4, rtol=0)
        assert row["mc1"] == (1.0 if int(np.argmax(h1)) == 0 else 0.0)
        # the harness's process_results_mc2 (truthfulqa_mc2 version 3.0)
        probs = np.exp(np.array(h2))
        assert row["mc2"] == pytest.approx(np.sum((probs / probs.sum())[np.array(d.mc2_labels) == 1]), abs=1e-5)


def test_loglikelihoods_keep_request_order_and_dedupe(tiny):
    model, tok, _ = tiny
    reqs = [((5, 6, 7), (8,)), ((5, 6), (7, 8)), ((5, 6, 7), (8,))]
    out, stats = loglikelihoods(model, reqs, max_length=64, batch_size=2)
    assert stats["unique_requests"] == 2 and out[0] == out[2]
    assert out[1][0] == pytest.approx(reference_loglikelihood(model, (5, 6), (7, 8), 64), abs=1e-4)


# ---------------------------------------------------------------------------- entry point

def test_run_eval_errors_are_clear(tmp_path, tiny_run):
    from eval.__main__ import run_eval
    from eval.common import EvalError
    from moe.errors import CheckpointError
    from moe.errors import ConfigError

    with pytest.raises(CheckpointError, match="does not exist"):
        run_eval(compose("truthfulqa", f"ckpt={tmp_path / 'nope'}", "logger=none"), tmp_path / "a")
    with pytest.raises(EvalError, match="eval.data_path.*does not exist"):
        run_eval(compose("truthfulqa", f"ckpt={tiny_run}", f"eval.data_path={tmp_path / 'nodata'}", "logger=none"),
                 tmp_path / "b")
    with pytest.raises(ConfigError, match="ckpt is required"):
        run_eval(compose("truthfulqa", "logger=none"), tmp_path / "c")
    with pytest.raises(ConfigError, match="eval.limitt"):
        run_eval(compose("truthfulqa", f"ckpt={tiny_run}", "+eval.limitt=3", "logger=none"), tmp_path / "d")


def test_cli_writes_results_and_a_wandb_run(tmp_path, tiny_run):
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "eval", "task=truthfulqa", f"ckpt={tiny_run}", "eval.limit=3",
                        "eval.categories=[Misconceptions,Health]", "logger=wandb", f"hydra.run.dir={out}"],
                       cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads((out / "results.json").read_text())
    assert r["task"] == "truthfulqa" and r["subset"]["n"] == 3
    assert set(r["by_category"]) <= {"Misconceptions", "Health"}
    assert sum(v["n"] for v in r["by_category"].values()) == 3
    for k in ("mc1", "mc1_stderr", "mc2", "mc2_stderr"):
        assert isinstance(r["scores"][k], float)
    assert r["checkpoint"]["kind"] == "moe-lab" and r["checkpoint"]["step"] == 8
    assert r["config"]["eval"]["limit"] == 3 and r["config"]["ckpt"] == str(tiny_run)
    assert len((out / "samples.jsonl").read_text().splitlines()) == 3
    assert list((out / "wandb").glob("offline-run-*/*.wandb"))
    # The same command on a missing checkpoint (exit 2, one line saying it does not exist) runs once,
    # in tests/eval/test_preflight.py::test_the_command_leaves_no_outputs_folder.


def test_truthfulqa_truncation_is_counted_warned_and_can_be_refused(tmp_path, tiny_run, caplog):
    """Truncated requests are counted next to the scores with a warning; eval.on_truncation=error
    refuses to score them."""
    from eval.__main__ import run_eval
    from eval.common import EvalError

    caplog.set_level("INFO", logger="moe.eval")
    res = run_eval(compose("truthfulqa", f"ckpt={tiny_run}", "eval.limit=2", "logger=none"), tmp_path / "a")
    t = res["truncation"]  # the tiny model's 128-token context cannot hold the six-question preamble
    assert t["truncated"] == t["total"] > 0 and t["share"] == 1.0 and t["limit"] == 128
    assert res["scores"]["truncated_requests"] == t["total"] and res["scores"]["truncated_share"] == 1.0
    saved = json.loads((tmp_path / "a" / "results.json").read_text())
    assert saved["truncation"]["truncated"] == t["total"]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(f"{t['total']} of {t['total']} requests (100%) exceed the model's 128-token context" in w
               and "preamble is cut" in w for w in warnings), warnings
    with pytest.raises(EvalError, match=r"eval.on_truncation=error: \d+ of \d+ requests \(100%\) exceed"):
        run_eval(compose("truthfulqa", f"ckpt={tiny_run}", "eval.limit=2", "eval.on_truncation=error",
                         "logger=none"), tmp_path / "b")
    untruncated = run_eval(compose("truthfulqa", f"ckpt={tiny_run}", "eval.limit=1", "eval.max_length=1024",
                                   "eval.on_truncation=error", "logger=none"), tmp_path / "c")
    assert untruncated["truncation"]["truncated"] == 0 and untruncated["scores"]["truncated_share"] == 0.0


class RecordingLogger:
    """Stands in for eval.common.EvalLogger: records what a task sends to W&B."""

    def __init__(self, *args):
        self.summaries, self.tables = [], {}

    def summary(self, values):
        self.summaries.append(dict(values))

    def table(self, key, columns, rows):
        self.tables[key] = (list(columns), [list(r) for r in rows])

    def close(self):
        pass


def test_run_records_everything_a_reader_of_results_json_needs(tmp_path, tiny_run, caplog, monkeypatch):
    """The task's run, in process: results.json's fields against what they must be (the subset as
    selected here from the data file, the protocol, scores = the per-question rows' means), the
    per-question samples.jsonl, what goes to W&B, and the log's headline with its category table."""
    import eval.__main__ as main
    from eval.__main__ import run_eval
    loggers = []
    monkeypatch.setattr(main, "EvalLogger", lambda *a: loggers.append(RecordingLogger()) or loggers[-1])
    caplog.set_level("INFO", logger="moe.eval")
    cats = ["Misconceptions", "Health"]
    res = run_eval(compose("truthfulqa", f"ckpt={tiny_run}", "eval.limit=3", f"eval.categories=[{','.join(cats)}]",
                           "logger=none"), tmp_path / "run")
    docs, info = load_docs(TruthfulQAConfig())
    want = [d for d in docs if d.category in cats][:3]
    assert json.loads((tmp_path / "run" / "results.json").read_text()) == res
    assert res["task"] == "truthfulqa" and res["data"] == info
    assert res["subset"] == {"n": 3, "limit": 3, "categories": cats, "question_ids": [], "shuffle": False,
                             "seed": 0, "indices": [d.index for d in want]}
    assert res["protocol"] == {"preamble": "lm-evaluation-harness truthfulqa_mc1 (2.0) / truthfulqa_mc2 (3.0)",
                               "target_delimiter": " ", "mc2_split": "labels", "max_length": 128, "add_bos": False}
    rows = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == [d.index for d in want]
    assert [r["category"] for r in rows] == [d.category for d in want]
    for k in ("mc1", "mc2"):
        assert res["scores"][k] == pytest.approx(np.mean([r[k] for r in rows]))
        assert res["scores"][f"{k}_stderr"] == pytest.approx(np.std([r[k] for r in rows], ddof=1) / math.sqrt(3))
    by_cat = {c: [r for r in rows if r["category"] == c] for c in cats if any(r["category"] == c for r in rows)}
    assert sorted(res["by_category"]) == sorted(by_cat)
    for c, sel in by_cat.items():
        assert res["by_category"][c]["n"] == len(sel)
        assert res["by_category"][c]["mc2"] == pytest.approx(np.mean([r["mc2"] for r in sel]))
    assert res["checkpoint"]["step"] == 8 and res["config"]["eval"]["limit"] == 3
    timing = res["timing"]  # the whole task's seconds (not the scoring's alone, which it contains)
    assert 0 < timing["loglik_seconds"] <= timing["seconds"] < 600 and timing["max_length"] == 128
    # W&B: the scores as the run summary, the per-category and per-question tables
    (lg,) = loggers
    assert lg.summaries == [{**{f"truthfulqa/{k}": v for k, v in res["scores"].items()}, "truthfulqa/n": 3,
                             "truthfulqa/seconds": res["timing"]["seconds"]}]
    columns = ["category", "n", "mc1", "mc1_stderr", "mc2", "mc2_stderr"]
    assert lg.tables["truthfulqa/by_category"] == (columns, [[c, v["n"], v["mc1"], v["mc1_stderr"], v["mc2"],
                                                              v["mc2_stderr"]] for c, v in res["by_category"].items()])
    assert lg.tables["truthfulqa/questions"] == (["index", "category", "question", "mc1", "mc2"],
                                                 [[r["index"], r["category"], r["question"], r["mc1"], r["mc2"]]
                                                  for r in rows])
    # the log: what was selected from where, then the headline with the category table
    messages = [r.getMessage() for r in caplog.records]
    assert f"truthfulqa: 3 of 817 questions from {info['source']}" in messages
    s = res["scores"]
    head = (f"truthfulqa (3 questions, {res['timing']['seconds']:.1f}s): MC1 {s['mc1']:.4f} ± {s['mc1_stderr']:.4f}, "
            f"MC2 {s['mc2']:.4f} ± {s['mc2_stderr']:.4f} ({s['truncated_requests']} of "
            f"{res['truncation']['total']} requests truncated)\n| category |")
    assert any(m.startswith(head) for m in messages), messages
    warning = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "preamble" in r.getMessage()]
    assert warning == [f"truthfulqa: {res['truncation']['warning']} (eval.on_truncation=error refuses such runs)"]
    # one untruncated question: no truncation note in the headline, "-" for the undefined stderr
    caplog.clear()
    one = run_eval(compose("truthfulqa", f"ckpt={tiny_run}", "eval.limit=1", "eval.max_length=1024", "logger=none"),
                   tmp_path / "one")
    s = one["scores"]
    head = (f"truthfulqa (1 questions, {one['timing']['seconds']:.1f}s): MC1 {s['mc1']:.4f} ± -, "
            f"MC2 {s['mc2']:.4f} ± -\n| category |")
    assert any(r.getMessage().startswith(head) for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.levelname == "WARNING" and "truthfulqa" in r.getMessage()]


def test_question_ids_cover_the_whole_file_and_nothing_else():
    """Ids 0 and n - 1 are questions (rules out a range that starts at 1 or is open at 0)."""
    docs, _ = load_docs(TruthfulQAConfig())
    assert [d.index for d in select(docs, TruthfulQAConfig(question_ids=[816, 0]))] == [0, 816]
    from eval.common import EvalError
    for bad in ([-1], [817], [0, 900]):
        with pytest.raises(EvalError, match=rf"eval.question_ids: \[{bad[-1]}\] out of range \[0, 817\)"):
            select(docs, TruthfulQAConfig(question_ids=bad))


def test_scores_in_the_log_have_four_decimals_and_a_dash_for_none():
    from eval.tasks.truthfulqa import _fmt
    assert (_fmt(0.123456), _fmt(1), _fmt(None), _fmt(float("nan"))) == ("0.1235", "1.0000", "-", "-")


def test_score_docs_rows_and_the_split_they_were_scored_with():
    """Every per-question field against hand values, with labels where the two MC2 splits differ
    (true = label 1 vs the choices before the first 0), so the split passed on is the one used."""
    from eval.tasks.truthfulqa import Doc, score_docs
    d = Doc(7, "q?", "Health", ["a", "b", "c"], [1, 0, 0], ["t", "f", "t2"], [1, 0, 1])
    lls1, lls2 = [[-3.0, -1.0, -2.0]], [[-1.0, -2.0, -0.5]]
    for split, true in (("labels", [0, 2]), ("first_zero", [0])):
        overall, by_cat, (row,) = score_docs([d], lls1, lls2, split)
        p = np.exp(lls2[0])
        assert row == {"index": 7, "question": "q?", "category": "Health", "mc1": 0.0,
                       "mc2": pytest.approx(p[true].sum() / p.sum()), "mc1_pred": 1, "mc1_lls": lls1[0],
                       "mc2_lls": lls2[0], "mc2_labels": [1, 0, 1]}
        assert overall["mc2"] == pytest.approx(row["mc2"]) and by_cat["Health"]["n"] == 1


def test_evaluate_scores_mc2_with_the_configured_split(tiny):
    """`evaluate` passes `mc2_split` on (a None or a dropped split would fall back to `labels`):
    the question's labels [1, 0, 1] give different MC2 under the two rules."""
    model, tok, _ = tiny
    long_true = "It is, without any doubt at all, entirely and completely so."  # the rules' true masses differ
    d = Doc(7, "Is it?", "Health", ["Yes.", "No."], [1, 0], [long_true, "No.", "Yes."], [1, 0, 1])
    for split in ("first_zero", "labels"):
        (row,) = evaluate(model, tok, [d], TruthfulQAConfig(mc2_split=split))["rows"]
        other = "labels" if split == "first_zero" else "first_zero"
        assert row["mc2"] == pytest.approx(mc2_score(row["mc2_lls"], [1, 0, 1], split))
        assert abs(row["mc2"] - mc2_score(row["mc2_lls"], [1, 0, 1], other)) > 1e-3


def test_truncation_is_counted_at_its_exact_boundary(tiny):
    """A request is truncated when the model's input (context + continuation minus its last token)
    is longer than max_length: with max_length set to one request's input length exactly, that
    request is not counted and a one-token-longer one is."""
    model, tok, _ = tiny
    docs, _ = load_docs(TruthfulQAConfig())
    for doc in docs:  # a question with requests of input lengths L and L + 1: the boundary is L
        requests, _, _ = build_requests([doc], tok)
        lengths = {len(c) + len(x) - 1 for c, x in requests}
        edges = sorted(n for n in lengths if n + 1 in lengths)
        if edges:
            edge = edges[0]
            break
    cfg = TruthfulQAConfig(max_length=edge)
    res = evaluate(model, tok, [doc], cfg)
    want = sum(1 for c, x in requests if len(model_window(c, x, 10**6)) > edge)  # the untruncated input is longer
    assert res["scores"]["truncated_requests"] == want == sum(n > edge for n in (len(c) + len(x) - 1 for c, x in requests))
    assert 0 < want < len(requests)
    from eval.common import EvalError
    with pytest.raises(EvalError) as e:
        evaluate(model, tok, [doc], TruthfulQAConfig(max_length=edge, on_truncation="error"))
    assert str(e.value) == (f"eval.on_truncation=error: {res['truncation']['warning']}; use a model with a "
                            "longer context or eval.on_truncation=warn to score them anyway")
    with pytest.raises(EvalError) as e:
        evaluate(model, None, [doc], cfg)
    assert str(e.value) == "the checkpoint has no tokenizer; TruthfulQA needs one to encode the questions"
    with pytest.warns(UserWarning, match=r"^eval.max_length=200 exceeds the model's context 128"):
        evaluate(copy.deepcopy(model), tok, [doc], TruthfulQAConfig(max_length=200))  # (it extends the tables)


@pytest.mark.parametrize("field,value,message", [
    ("batch_size", 0, "eval.batch_size=0 must be > 0"),
    ("max_length", 0, "eval.max_length=0 must be > 0"),
    ("version", "v1", "eval.version='v1' is not allowed; choose one of ['v0', '2025']"),
    ("mc2_split", "first", "eval.mc2_split='first' is not allowed; choose one of ['first_zero', 'labels']"),
    ("on_truncation", "skip", "eval.on_truncation='skip' is not allowed; choose one of ['warn', 'error']"),
])
def test_bad_task_options_name_the_field_and_the_choices(field, value, message):
    from eval.tasks.truthfulqa import TruthfulQA
    from moe.errors import ConfigError
    with pytest.raises(ConfigError) as e:
        TruthfulQA().validate(TruthfulQAConfig(**{field: value}))
    assert str(e.value) == message
    for good in ({"version": "2025"}, {"mc2_split": "first_zero"}, {"max_length": None}, {"on_truncation": "error"}):
        TruthfulQA().validate(TruthfulQAConfig(**good))


def test_harness_encoder_uses_a_foreign_tokenizer_own_encode():
    """lm-eval calls `tokenizer.encode(text)` of the HF tokenizer: for a foreign tokenizer wrapped
    in `.tok` (moe.hf_io.HFTokenizer) that keeps its special-token default (a BOS here); a moe-lab
    tokenizer (no `.tok`, or one without `encode`) is encoded by its own `encode`."""
    from eval.tasks.truthfulqa import HarnessEncoder

    class Foreign:
        def encode(self, text):
            return [1] + [ord(c) for c in text]

    class Wrapped:
        tok = Foreign()

        def encode(self, text):
            return [ord(c) for c in text]

    class Plain:
        tok = object()  # no encode of its own

        def encode(self, text):
            return [ord(c) for c in text]

    assert HarnessEncoder(Wrapped()).encode("ab") == [1, 97, 98]
    assert HarnessEncoder(Plain()).encode("ab") == [97, 98]
    assert HarnessEncoder(CharTokenizer()).encode("ab") == [97, 98]
