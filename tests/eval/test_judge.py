"""MT-Bench judging: FastChat's rating parser on real judge outputs, FastChat's prompts and
matches, and grading against a real OpenAI-compatible HTTP server on loopback (retries on 429/5xx
honouring the reset header, bounded concurrency, resumption, the judgment file format)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from eval.judge import (ChatClient, JudgeAPIError, load_judge_prompts, make_matches, parse_rating, parse_reset,
                        retry_delay_from_headers, score_table, user_prompt)
from tests.eval.conftest import MT_BENCH, compose

# Endings of real GPT-4 judgments (FastChat's published japanese_mt_bench gpt-4_single.jsonl,
# question 61 and 63, turn 2), and real-world deviations from the requested format.
REAL_JUDGMENTS = [
    ("The assistant's response lacks depth, clarity, and accuracy. Therefore, the quality of the response is "
     "poor. Rating: [[2]]", 2),
    ("The assistant's response is relevant to the user's question, but it lacks accuracy and depth. "
     "Rating: [[3]]", 3),
    ("Overall, a strong answer with a minor slip in the final step.\n\nRating: [[8.5]]", 8.5),
    ("The answer is correct and well explained. Rating: [9]", 9),  # single brackets: the backup pattern
    ("I would rate it [5] at first sight, but after checking the reference: Rating: [[7]]", 7),  # [[x]] wins
    ("The response is incorrect. I cannot give it a rating.", -1),
    ("Rating: [[A]]", -1),
    ("$ERROR$", -1),
]


@pytest.mark.parametrize("text,expected", REAL_JUDGMENTS)
def test_rating_parser(text, expected):
    assert parse_rating(text) == expected


def test_rate_limit_headers():
    assert parse_reset("1.5") == 1.5
    assert parse_reset("20ms") == pytest.approx(0.02)
    assert parse_reset("6m0s") == 360
    assert parse_reset("1h2m3.5s") == pytest.approx(3723.5)
    assert parse_reset("soon") is None
    assert retry_delay_from_headers({"retry-after-ms": "250"}) == 0.25
    assert retry_delay_from_headers({"retry-after": "2", "x-ratelimit-reset-tokens": "3s"}) == 3
    assert retry_delay_from_headers({}) is None


def test_matches_follow_fastchat(shared_data):
    qs = {json.loads(line)["question_id"]: json.loads(line) for line in (MT_BENCH / "question.jsonl").open()}
    answers = {json.loads(line)["question_id"]: json.loads(line)
               for line in (MT_BENCH / "model_answer" / "vicuna-13b-v1.3.jsonl").open()}
    refs = {json.loads(line)["question_id"]: json.loads(line)
            for line in (MT_BENCH / "reference_answer" / "gpt-4.jsonl").open()}
    prompts = load_judge_prompts(MT_BENCH / "judge_prompts.jsonl")
    matches = make_matches([qs[81], qs[141], qs[101]], {"vicuna": {q: answers[q] for q in (81, 141, 101)}},
                           prompts, refs)
    names = sorted((m.question["question_id"], m.turn, m.prompt["name"]) for m in matches)
    assert names == [(81, 1, "single-v1"), (81, 2, "single-v1-multi-turn"), (101, 1, "single-math-v1"),
                     (101, 2, "single-math-v1-multi-turn"), (141, 1, "single-v1"), (141, 2, "single-v1-multi-turn")]
    m101 = next(m for m in matches if m.question["question_id"] == 101 and m.turn == 2)
    text = user_prompt(m101)
    assert refs[101]["choices"][0]["turns"][1] in text and answers[101]["choices"][0]["turns"][1] in text
    assert qs[101]["turns"][0] in text and qs[101]["turns"][1] in text
    m81 = next(m for m in matches if m.question["question_id"] == 81 and m.turn == 1)
    assert user_prompt(m81) == prompts["single-v1"]["prompt_template"].format(
        question=qs[81]["turns"][0], answer=answers[81]["choices"][0]["turns"][0])


# ---------------------------------------------------------------------------- a real server

class FakeJudgeServer:
    """An OpenAI-compatible /v1/chat/completions on 127.0.0.1: the first request answers 429
    (with a reset header), the second 500, then judgments rating turn 1 [[4]] and turn 2 [[7]],
    except question 111's turn 1, which gets a judgment without a rating."""

    def __init__(self, delay_s: float = 0.02):
        self.requests, self.in_flight, self.max_in_flight = [], 0, 0
        self.delay_s = delay_s
        self.lock = threading.Lock()
        self.fail_plan = [429, 500]
        self.status_override = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                    status = outer.status_override or (outer.fail_plan.pop(0) if outer.fail_plan else 200)
                time.sleep(outer.delay_s)
                with outer.lock:  # done before the reply is sent, so the count never overlaps the next request
                    outer.in_flight -= 1
                if status != 200:
                    self.send_response(status)
                    if status == 429:
                        self.send_header("x-ratelimit-reset-requests", "50ms")
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(json.dumps({"error": {"message": f"status {status}"}}).encode())
                    return
                user = body["messages"][1]["content"]
                multi = "<|The Start of Assistant A's Conversation with User|>" in user
                text = f"Explanation of the grade. Rating: [[{7 if multi else 4}]]"
                if "The vertices of a triangle" in user and not multi:  # question 111, turn 1
                    text = "I refuse to grade this."
                payload = {"id": "x", "object": "chat.completion", "model": body["model"],
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                        "finish_reason": "stop"}]}
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self):
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_judging_against_a_local_openai_compatible_server(tmp_path, monkeypatch, shared_data):
    from eval.__main__ import run_eval

    monkeypatch.setenv("MY_JUDGE_KEY", "sk-test")
    answers = MT_BENCH / "model_answer" / "vicuna-13b-v1.3.jsonl"
    out = tmp_path / "run"
    with FakeJudgeServer() as server:
        args = ["judge=openai", f"judge.base_url={server.base_url}", "judge.model=judge-x", "judge.concurrency=2",
                "judge.api_key_env=MY_JUDGE_KEY", "judge.backoff_base_s=0.01", "judge.backoff_max_s=0.05",
                f"eval.answer_file={answers}", "eval.question_ids=[81,101,111]", "logger=none"]
        res = run_eval(compose("mt_bench", *args), out)
        n_first = len(server.requests)
        # Resumable: a rerun in the same directory asks for nothing...
        res2 = run_eval(compose("mt_bench", *args), out)
        assert len(server.requests) == n_first and res2["judge"]["stats"]["skipped_existing"] == 6
        # ...and after losing two judgments, asks for exactly those.
        jfile = out / "model_judgment" / "judge-x_single.jsonl"
        lines = jfile.read_text().splitlines()
        jfile.write_text("\n".join(lines[:-2]) + "\n")
        res3 = run_eval(compose("mt_bench", *args), out)
        assert len(server.requests) == n_first + 2 and res3["judge"]["stats"]["judged"] == 2

    st = res["judge"]["stats"]
    assert st["judged"] == 6 and st["failed"] == 0 and st["rate_limited"] == 1 and st["server_errors"] == 1
    assert st["retries"] == 2 and n_first == 8
    assert server.max_in_flight <= 2
    r0 = server.requests[-1]
    assert r0["path"] == "/v1/chat/completions" and r0["auth"] == "Bearer sk-test"
    assert r0["model"] == "judge-x" and r0["temperature"] == 0 and r0["max_tokens"] == 2048
    assert [m["role"] for m in r0["messages"]] == ["system", "user"]

    rows = [json.loads(line) for line in jfile.read_text().splitlines()]
    assert len(rows) == 6
    types = {"question_id": int, "model": str, "judge": list, "user_prompt": str, "judgment": str,
             "score": (int, float), "turn": int, "tstamp": float}
    for r in rows:  # FastChat's play_a_match_single fields, in its order
        assert list(r) == list(types)
        assert all(isinstance(r[k], t) for k, t in types.items())
        assert r["model"] == "vicuna-13b-v1.3" and r["judge"][0] == "judge-x"
    by = {(r["question_id"], r["turn"]): r for r in rows}
    assert by[(101, 1)]["judge"][1] == "single-math-v1" and by[(81, 2)]["judge"][1] == "single-v1-multi-turn"
    assert by[(111, 1)]["score"] == -1 and by[(81, 1)]["score"] == 4 and by[(81, 2)]["score"] == 7

    scores = res3["judge"]["scores"]
    assert scores["overall"]["turn1"] == {"score": 4.0, "stderr": 0.0, "n": 2, "invalid": 1}
    assert scores["overall"]["turn2"] == {"score": 7.0, "stderr": 0.0, "n": 3, "invalid": 0}
    assert scores["by_category"]["math"]["turn1"]["invalid"] == 1
    assert set(scores["by_category"]) == {"writing", "reasoning", "math"}
    saved = json.loads((out / "results.json").read_text())
    assert saved["judge"]["judgment_file"] == str(jfile) and saved["model_id"] == "vicuna-13b-v1.3"
    assert saved["checkpoint"]["kind"] is None  # judging a given answer file needs no checkpoint


def test_client_gives_up_clearly():
    with FakeJudgeServer() as server:
        server.status_override = 401
        c = ChatClient(server.base_url, "m", "bad", max_retries=3, backoff_base_s=0.01)
        with pytest.raises(JudgeAPIError, match="HTTP 401.*api_key_env") as e:
            c.complete([{"role": "user", "content": "x"}])
        assert not e.value.retryable and len(server.requests) == 1  # not retried
        server.status_override = 503
        waits = []
        c = ChatClient(server.base_url, "m", None, max_retries=2, backoff_base_s=0.01, sleep=waits.append)
        with pytest.raises(JudgeAPIError, match="gave up after 3 attempts.*HTTP 503"):
            c.complete([{"role": "user", "content": "x"}])
        assert len(waits) == 2 and server.requests[-1]["auth"] is None
        server.status_override = 429  # the reset header (50ms) is longer than the backoff: honoured
        waits = []
        c = ChatClient(server.base_url, "m", None, max_retries=1, backoff_base_s=0.001, sleep=waits.append)
        with pytest.raises(JudgeAPIError):
            c.complete([{"role": "user", "content": "x"}])
        assert waits == [pytest.approx(0.05)]


def test_score_table_excludes_unparsable_ratings():
    qs = [{"question_id": 1, "category": "a"}, {"question_id": 2, "category": "b"}]
    js = [{"question_id": 1, "model": "m", "score": 8, "turn": 1}, {"question_id": 1, "model": "m", "score": -1, "turn": 2},
          {"question_id": 2, "model": "m", "score": 4, "turn": 1}, {"question_id": 2, "model": "m", "score": 6.5, "turn": 2}]
    t = score_table(js, qs)
    assert t["overall"]["all"] == {"score": pytest.approx(18.5 / 3), "n": 3, "invalid": 1,
                                   "stderr": pytest.approx(float(np.std([8, 4, 6.5], ddof=1) / np.sqrt(3)))}
    assert t["by_category"]["a"]["turn2"] == {"score": None, "stderr": None, "n": 0, "invalid": 1}
    assert t["by_category"]["b"]["all"]["score"] == 5.25


@pytest.mark.filterwarnings("ignore:max_model_len=8192 exceeds the model's context")
def test_judging_through_the_projects_own_server(tmp_path, tiny, monkeypatch, shared_data):
    """The same client against `moe.serve` (the project's OpenAI-compatible server) under uvicorn
    on loopback, serving the tiny model as the 'judge': the request/response protocol, the API
    key, and the bookkeeping of ratings it cannot parse."""
    pytest.importorskip("uvicorn")
    serve = pytest.importorskip("moe.serve")
    import copy
    import socket

    import uvicorn

    from eval.__main__ import run_eval
    from moe.engine import LLM

    model, tok, _ = tiny
    llm = LLM.from_model(copy.deepcopy(model), tok, max_model_len=8192, allow_long_context=True, max_num_seqs=4, seed=0)
    app = serve.create_app(llm, "tiny-judge", api_key="k-123")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "moe.serve did not start"
            time.sleep(0.05)
        monkeypatch.setenv("TINY_JUDGE_KEY", "k-123")
        res = run_eval(compose("mt_bench", "judge=openai", f"judge.base_url=http://127.0.0.1:{sock.getsockname()[1]}/v1",
                               "judge.model=tiny-judge", "judge.api_key_env=TINY_JUDGE_KEY", "judge.max_tokens=4",
                               f"eval.answer_file={MT_BENCH / 'model_answer' / 'gpt-4.jsonl'}",
                               "eval.question_ids=[81]", "logger=none"), tmp_path / "run")
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
    st = res["judge"]["stats"]
    assert st["judged"] == 2 and st["failed"] == 0, st["errors"]
    rows = [json.loads(line) for line in open(res["judge"]["judgment_file"])]
    assert sorted(r["turn"] for r in rows) == [1, 2] and all(r["judge"][0] == "tiny-judge" for r in rows)
    assert all(r["score"] == parse_rating(r["judgment"]) for r in rows)
    n_invalid = sum(r["score"] == -1 for r in rows)
    assert res["judge"]["scores"]["overall"]["all"]["invalid"] == n_invalid


@pytest.mark.slow
def test_a_killed_judge_resumes_without_duplicate_or_stale_judgments(tmp_path, shared_data):
    """`python -m eval task=mt_bench judge=openai` is SIGKILLed mid-run (and its file gets a line
    torn as by a crash mid-write); the rerun judges exactly what is missing. Then two answers are
    regenerated: their judgments (turn 2 of 81; both turns of 101, whose turn-2 prompt shows the
    first answer too) are judged again, and the old ones leave the file for the .stale file."""
    import signal
    import subprocess
    import sys

    from eval.__main__ import run_eval
    from tests.eval.conftest import REPO

    answers = tmp_path / "answers.jsonl"
    rows = [json.loads(ln) for ln in (MT_BENCH / "model_answer" / "vicuna-13b-v1.3.jsonl").open()]
    answers.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    jfile = out / "model_judgment" / "judge-x_single.jsonl"
    qids = [81, 82, 101, 102, 111, 112]
    with FakeJudgeServer(delay_s=0.3) as server:
        server.fail_plan = []
        args = ["task=mt_bench", "judge=openai", f"judge.base_url={server.base_url}", "judge.model=judge-x",
                "judge.concurrency=2", f"eval.answer_file={answers}", f"eval.question_ids=[{','.join(map(str, qids))}]",
                "logger=none"]
        proc = subprocess.Popen([sys.executable, "-m", "eval", *args, f"hydra.run.dir={out}"], cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not (jfile.is_file() and len(jfile.read_text().splitlines()) >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        done = len(jfile.read_text().splitlines())
        assert 3 <= done < 12
        with open(jfile, "a") as f:
            f.write('{"question_id": 112, "model": "vicuna-13b-v1.3", "judge": ["judge-x", "sing')  # torn
        n_before = len(server.requests)
        res = run_eval(compose("mt_bench", *args[1:]), out)
        st = res["judge"]["stats"]
        assert (st["skipped_existing"], st["judged"], st["failed"]) == (done, 12 - done, 0)
        assert len(server.requests) == n_before + 12 - done
        judged = [json.loads(ln) for ln in jfile.read_text().splitlines()]
        keys = sorted((j["question_id"], j["turn"]) for j in judged)
        assert keys == sorted((q, t) for q in qids for t in (1, 2))  # each match exactly once

        by_q = {r["question_id"]: r for r in rows}
        by_q[81]["choices"][0]["turns"][1] = "A regenerated second answer."
        by_q[101]["choices"][0]["turns"][0] = "A regenerated first answer."
        answers.write_text("".join(json.dumps(r) + "\n" for r in rows))
        res = run_eval(compose("mt_bench", *args[1:]), out)
        assert (res["judge"]["stats"]["judged"], res["judge"]["stats"]["skipped_existing"]) == (3, 9)
    judged = [json.loads(ln) for ln in jfile.read_text().splitlines()]
    assert sorted((j["question_id"], j["turn"]) for j in judged) == sorted((q, t) for q in qids for t in (1, 2))
    assert "A regenerated second answer." in next(j for j in judged if (j["question_id"], j["turn"]) == (81, 2))[
        "user_prompt"]
    stale = [json.loads(ln) for ln in jfile.with_suffix(".stale.jsonl").read_text().splitlines()]
    assert sorted((j["question_id"], j["turn"]) for j in stale) == [(81, 2), (101, 1), (101, 2)]
