"""MT-Bench generation: prompts through the chat template with turn 2 conditioned on the model's
own turn 1, FastChat's temperatures, answers in FastChat's model_answer format (compared with the
published files), subsets, and a real run through the engine with judge=none."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from eval.tasks.mt_bench import MTBenchConfig, PromptBuilder, generate_answers, load_questions, select, temperature_for
from moe.engine import RequestOutput, StreamEvent
from eval.common import IncompleteEvalError
from tests.eval.conftest import MT_BENCH, REPO, compose
from tests.eval.test_judge import FakeJudgeServer


def field_types(row: dict) -> dict:
    return {k: type(v).__name__ for k, v in row.items()}


def test_fastchat_temperatures():
    cfg = MTBenchConfig()
    assert {c: temperature_for(cfg, c) for c in ("writing", "roleplay", "stem", "humanities", "math", "coding",
                                                 "reasoning", "extraction", "other")} == \
        {"writing": 0.7, "roleplay": 0.7, "stem": 0.1, "humanities": 0.1, "math": 0.0, "coding": 0.0,
         "reasoning": 0.0, "extraction": 0.0, "other": 0.7}
    assert temperature_for(MTBenchConfig(temperature=0.0), "writing") == 0.0


def test_subsets(shared_data):
    qs = load_questions(MT_BENCH)
    assert len(qs) == 80 and all(len(q["turns"]) == 2 for q in qs)
    assert [q["question_id"] for q in select(qs, MTBenchConfig(limit=3))] == [81, 82, 83]
    math_qs = select(qs, MTBenchConfig(categories=["math"]))
    assert len(math_qs) == 10 and {q["category"] for q in math_qs} == {"math"}
    assert [q["question_id"] for q in select(qs, MTBenchConfig(question_ids=[160, 81]))] == [81, 160]
    from eval.common import EvalError
    with pytest.raises(EvalError, match="not in MT-Bench"):
        select(qs, MTBenchConfig(question_ids=[7]))


class EchoEngine:
    """The engine's public API (add_request / step / has_unfinished_requests / stats) over no
    model: records what it is asked and answers 'A<qid>.<turn>' at the next step, the question
    and turn read back from the prompt."""

    def __init__(self, tok, questions):
        self.tok, self.questions, self.queue, self.seen = tok, questions, [], {}

    def add_request(self, ids, params):
        rid = f"req-{len(self.seen)}"
        text = self.tok.decode(ids, skip_special_tokens=False)
        q = next(q for q in self.questions if q["turns"][0] in text)
        tag = (q["question_id"], 1 if q["turns"][1] in text else 0)
        self.queue.append((rid, tag, ids))
        self.seen[tag] = (ids, params)
        return rid

    def has_unfinished_requests(self):
        return bool(self.queue)

    def step(self):
        events = []
        for rid, tag, ids in self.queue:
            text = f" A{tag[0]}.{tag[1] + 1} "
            out = RequestOutput(rid, None, list(ids), text, self.tok.encode(text), True, "stop")
            events.append(StreamEvent(None, rid, text, out.token_ids, True, "stop", out))
        self.queue = []
        return events

    def stats(self):
        return {}


def test_turn2_sees_the_models_own_turn1_answer_through_the_chat_template(tiny, monkeypatch, shared_data):
    model, tok, _ = tiny
    qs = [q for q in load_questions(MT_BENCH) if q["question_id"] in (81, 141)]  # writing, stem
    engine = EchoEngine(tok, qs)
    engine.shutdown = lambda: None
    monkeypatch.setattr("eval.generation.LLM", SimpleNamespace(from_model=lambda *a, **k: engine))
    cfg = MTBenchConfig(max_new_tokens=16, max_model_len=4096, seed=3)
    ctx = SimpleNamespace(cfg=SimpleNamespace(tensor_parallel_size=1), model=model, tokenizer=tok, model_cfg=model.cfg)
    rows, stats = generate_answers(ctx, qs, cfg, "m")
    assert [r["choices"][0]["turns"] for r in rows] == [["A81.1", "A81.2"], ["A141.1", "A141.2"]]  # stripped
    by_tag = engine.seen
    q = qs[0]
    ids, p = by_tag[(81, 1)]
    assert tok.decode(ids, skip_special_tokens=False) == tok.apply_chat_template(
        [{"role": "user", "content": q["turns"][0]}, {"role": "assistant", "content": "A81.1"},
         {"role": "user", "content": q["turns"][1]}], add_generation_prompt=True)
    assert p.temperature == 0.7 and p.seed is not None and set(p.stop_token_ids) == {tok.eos_id, 6}
    assert by_tag[(141, 0)][1].temperature == 0.1
    assert by_tag[(81, 0)][1].seed != by_tag[(81, 1)][1].seed
    assert stats["requests"] == 4 and stats["truncated_prompts"] == 0


def test_long_prompts_keep_their_last_tokens(tiny):
    _, tok, _ = tiny
    build = PromptBuilder(tok, max_model_len=64, max_new_tokens=1024)
    ids = build(["word " * 200], [])
    full = tok.encode(tok.apply_chat_template([{"role": "user", "content": "word " * 200}]))
    assert build.truncated == 1 and len(ids) == 32 and ids == full[-32:]  # room for min(1024, 64 // 2) tokens


def test_generation_with_the_engine_writes_fastchat_answers(tmp_path, tiny_run, shared_data):
    from eval.__main__ import run_eval

    out = tmp_path / "run"
    res = run_eval(compose("mt_bench", f"ckpt={tiny_run}", "judge=none", "logger=none", "eval.question_ids=[81,101]",
                           "eval.max_new_tokens=5"), out)
    model_id = res["model_id"]
    assert model_id == "run-step8"
    rows = [json.loads(line) for line in (out / "model_answer" / f"{model_id}.jsonl").read_text().splitlines()]
    published = [json.loads(line) for line in (MT_BENCH / "model_answer" / "vicuna-13b-v1.3.jsonl").open()]
    ref = published[0]
    assert [r["question_id"] for r in rows] == [81, 101]
    for r in rows:
        assert list(r) == list(ref) and field_types(r) == field_types(ref)
        assert [field_types(c) for c in r["choices"]] == [field_types(c) for c in ref["choices"]]
        assert r["choices"][0]["index"] == 0 and len(r["choices"][0]["turns"]) == 2
        assert all(isinstance(t, str) for t in r["choices"][0]["turns"])
        assert len(r["answer_id"]) == len(ref["answer_id"]) and r["model_id"] == model_id
    g = res["generation"]
    assert g["generator"] == "engine" and g["requests"] == 4 and 0 < g["output_tokens"] <= 20
    assert g["output_tokens_per_s"] > 0
    assert {(t["question_id"], t["turn"]) for t in g["per_turn"]} == {(81, 1), (81, 2), (101, 1), (101, 2)}
    assert all(t["output_tokens"] <= 5 and t["finish_reason"] in ("stop", "length") for t in g["per_turn"])
    saved = json.loads((out / "results.json").read_text())
    assert saved["subset"]["question_ids"] == [81, 101] and saved["generation"]["requests"] == 4
    assert "judge" not in saved


def test_mt_bench_truncated_prompts_can_be_refused(tmp_path, tiny_run):
    from eval.__main__ import run_eval

    args = [f"ckpt={tiny_run}", "judge=none", "logger=none", "eval.question_ids=[81]", "eval.max_new_tokens=4",
            "eval.max_model_len=48"]
    res = run_eval(compose("mt_bench", *args), tmp_path / "a")
    t = res["generation"]["truncation"]
    assert t["truncated"] == t["total"] == 2 and "without the start of the conversation" in t["warning"]
    with pytest.raises(IncompleteEvalError, match="eval.on_truncation=error: 2 of 2 prompts"):
        run_eval(compose("mt_bench", *args, "eval.on_truncation=error"), tmp_path / "b")
    saved = json.loads((tmp_path / "b" / "results.json").read_text())
    assert saved["incomplete"].startswith("eval.on_truncation=error") and "judge" not in saved


def test_failed_judgments_fail_the_run_with_a_summary(tmp_path, shared_data):
    from eval.__main__ import run_eval

    answers = MT_BENCH / "model_answer" / "vicuna-13b-v1.3.jsonl"
    with FakeJudgeServer() as server:
        server.status_override = 400  # e.g. a request the judge's API refuses
        args = ["judge=openai", f"judge.base_url={server.base_url}", "judge.model=judge-x", "judge.concurrency=1",
                f"eval.answer_file={answers}", "eval.question_ids=[81,82]", "logger=none"]
        with pytest.raises(IncompleteEvalError) as e:
            run_eval(compose("mt_bench", *args), tmp_path / "a")
        msg = str(e.value)
        assert msg.startswith("mt_bench: 4 of 4 judgments are missing (HTTP 400: 1, 3 not attempted")
        assert "judge.max_failures=N (now 0)" in msg
        saved = json.loads((tmp_path / "a" / "results.json").read_text())
        assert saved["incomplete"] == msg and saved["judge"]["missing"] == 4
        # tolerated: the run succeeds and records what is missing
        res = run_eval(compose("mt_bench", *args, "judge.max_failures=4"), tmp_path / "b")
        assert res["judge"]["missing"] == 4 and "incomplete" not in res
        # the command: one line on stderr, exit status 1, results.json written
        p = subprocess.run([sys.executable, "-m", "eval", "task=mt_bench", *args, f"hydra.run.dir={tmp_path / 'c'}"],
                           cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert lines[-1].startswith("error: mt_bench: 4 of 4 judgments are missing") and "Traceback" not in p.stderr
    assert sum(ln.startswith("error: ") for ln in lines) == 1
    assert "incomplete" in json.loads((tmp_path / "c" / "results.json").read_text())
