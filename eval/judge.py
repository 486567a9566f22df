"""MT-Bench single-answer grading through an OpenAI-compatible chat-completions endpoint.

What FastChat's `gen_judgment.py --mode single` does (fastchat/llm_judge/common.py):
  * questions of `math`, `reasoning`, `coding` (NEED_REF_CATS) are graded with
    `single-math-v1` and the reference answer (reference_answer/gpt-4.jsonl), the others with
    `single-v1`; turn 2 with the `-multi-turn` forms, which show the whole conversation;
  * messages = [system: the prompt's system_prompt, user: prompt_template.format(...)],
    temperature 0, max_tokens 2048;
  * rating = the first `[[x]]` in the judgment, else the first `[x]`, parsed with
    `ast.literal_eval`; none = -1 (kept in the file, excluded from the means, counted);
  * one JSON line per judgment: question_id, model, judge [judge model, prompt name],
    user_prompt, judgment, score, turn, tstamp; file `<judge model>_single.jsonl`.
Added here: bounded concurrency, retries with exponential backoff on 429 / 5xx / connection
errors that wait at least as long as the server's rate-limit reset header says
(`retry-after-ms`, `retry-after`, `x-ratelimit-reset-requests`, `x-ratelimit-reset-tokens`),
and resumption: judgments already in the output file are not requested again. A request that
still fails is not written (FastChat writes "$ERROR$" with score -1), so a rerun retries it.

The resume key is (question, model, judge, prompt, turn, a hash of the prompt the judge saw), and
that prompt holds the answer text: a regenerated answer is judged again, never given the old
judgment. On resume the file is reconciled first (`reconcile_judgments`): stale judgments (the
same question and turn, another answer) are moved to `<file>.stale.jsonl`, duplicates and a line
torn by a crash are dropped, so every match has exactly one judgment, of its current answer.
"""

from __future__ import annotations

import ast
import email.utils
import hashlib
import json
import logging
import os
import random
import re
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from eval.common import stderr

log = logging.getLogger("moe.eval")

NEED_REF_CATS = ("math", "reasoning", "coding")
ONE_SCORE = re.compile(r"\[\[(\d+\.?\d*)\]\]")
ONE_SCORE_BACKUP = re.compile(r"\[(\d+\.?\d*)\]")


def parse_rating(judgment: str):
    """FastChat's rating: `[[x]]`, else `[x]`, as a number; -1 when there is none."""
    m = ONE_SCORE.search(judgment) or ONE_SCORE_BACKUP.search(judgment)
    if not m:
        return -1
    try:
        return ast.literal_eval(m.groups()[0])
    except (ValueError, SyntaxError):
        return -1


def load_judge_prompts(path: Path) -> dict[str, dict]:
    with open(path, encoding="utf-8") as f:
        return {d["name"]: d for d in (json.loads(line) for line in f if line.strip())}


@dataclass
class Match:
    question: dict
    model: str
    answer: dict  # FastChat model_answer row
    prompt: dict  # a judge_prompts.jsonl row
    ref_answer: Optional[dict] = None
    multi_turn: bool = False

    @property
    def turn(self) -> int:
        return 2 if self.multi_turn else 1

    def key(self, judge_model: str) -> tuple:
        return (self.question["question_id"], self.model, judge_model, self.prompt["name"], self.turn,
                prompt_hash(user_prompt(self)))


def prompt_hash(text: str) -> str:
    """What a judgment was given to judge: the question, the answer(s), the reference."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def make_matches(questions: Sequence[dict], answers: dict[str, dict[int, dict]], prompts: dict[str, dict],
                 ref_answers: dict[int, dict]) -> list[Match]:
    """FastChat's make_match_single for every model in `answers` (model -> question_id -> answer)."""
    out = []
    for multi in (False, True):
        for q in questions:
            if multi and len(q["turns"]) != 2:
                continue
            ref_based = q["category"] in NEED_REF_CATS
            name = ("single-math-v1" if ref_based else "single-v1") + ("-multi-turn" if multi else "")
            ref = None
            if ref_based:
                ref = ref_answers.get(q["question_id"])
                if ref is None:
                    raise ValueError(f"question {q['question_id']} ({q['category']}) needs a reference answer, "
                                     "but the reference file has none")
            for model, by_q in answers.items():
                if q["question_id"] not in by_q:
                    raise ValueError(f"model {model!r} has no answer for question {q['question_id']}")
                out.append(Match(q, model, by_q[q["question_id"]], prompts[name], ref, multi))
    return out


def user_prompt(m: Match) -> str:
    """FastChat's run_judge_single prompt text."""
    kwargs = {}
    if m.ref_answer is not None:
        kwargs["ref_answer_1"] = m.ref_answer["choices"][0]["turns"][0]
        kwargs["ref_answer_2"] = m.ref_answer["choices"][0]["turns"][1]
    turns = m.answer["choices"][0]["turns"]
    if m.multi_turn:
        return m.prompt["prompt_template"].format(question_1=m.question["turns"][0], question_2=m.question["turns"][1],
                                                  answer_1=turns[0], answer_2=turns[1], **kwargs)
    return m.prompt["prompt_template"].format(question=m.question["turns"][0], answer=turns[0], **kwargs)


# ---------------------------------------------------------------------------- HTTP client

class JudgeAPIError(RuntimeError):
    def __init__(self, message: str, retryable: bool = True):
        super().__init__(message)
        self.retryable = retryable


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


def parse_reset(value: Optional[str]) -> Optional[float]:
    """Seconds from a rate-limit header: "1.5" / "20ms" / "6m0s" / "1h2m3.5s" / an HTTP date."""
    if not value:
        return None
    v = value.strip()
    try:
        return max(0.0, float(v))
    except ValueError:
        pass
    parts = _DURATION.findall(v)
    if parts and "".join(n + u for n, u in parts) == v.replace(" ", ""):
        scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
        return sum(float(n) * scale[u] for n, u in parts)
    try:
        when = email.utils.parsedate_to_datetime(v)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def retry_delay_from_headers(headers) -> Optional[float]:
    """The longest wait the server asks for (None when it says nothing)."""
    if headers is None:
        return None
    waits = []
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            waits.append(float(ms) / 1000.0)
        except ValueError:
            pass
    for h in ("retry-after", "x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"):
        w = parse_reset(headers.get(h))
        if w is not None:
            waits.append(w)
    return max(waits) if waits else None


class ChatClient:
    """POST {base_url}/chat/completions with retries; thread-safe (one request per call)."""

    def __init__(self, base_url: str, model: str, api_key: Optional[str] = None, timeout_s: float = 120.0,
                 max_retries: int = 8, backoff_base_s: float = 1.0, backoff_max_s: float = 60.0,
                 sleep=time.sleep):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key, self.timeout_s = model, api_key, timeout_s
        self.max_retries, self.backoff_base_s, self.backoff_max_s = max_retries, backoff_base_s, backoff_max_s
        self.sleep = sleep
        self.lock = threading.Lock()
        self.counters = {"requests": 0, "retries": 0, "rate_limited": 0, "server_errors": 0, "connection_errors": 0}

    def _count(self, key: str) -> None:
        with self.lock:
            self.counters[key] += 1

    def _post(self, body: dict) -> str:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            payload = json.loads(resp.read().decode("utf-8"))
        try:
            return payload["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise JudgeAPIError(f"unexpected response from {self.url}: {str(payload)[:300]}", retryable=True)

    def complete(self, messages: list[dict], temperature: float = 0.0, max_tokens: int = 2048) -> str:
        body = {"model": self.model, "messages": messages, "n": 1, "temperature": temperature,
                "max_tokens": max_tokens}
        last = "no attempt"
        for attempt in range(self.max_retries + 1):
            self._count("requests")
            server_wait = None
            try:
                return self._post(body)
            except urllib.error.HTTPError as e:
                detail = ""
                try:
                    detail = e.read().decode("utf-8", "replace")[:300]
                except Exception:  # noqa: BLE001
                    pass
                last = f"HTTP {e.code} from {self.url}: {detail}"
                if e.code == 429:
                    self._count("rate_limited")
                elif e.code >= 500:
                    self._count("server_errors")
                else:
                    hint = " (check the key in judge.api_key_env)" if e.code in (401, 403) else ""
                    raise JudgeAPIError(last + hint, retryable=False) from None
                server_wait = retry_delay_from_headers(e.headers)
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
                self._count("connection_errors")
                last = f"{type(e).__name__} talking to {self.url}: {getattr(e, 'reason', e)}"
            except (JudgeAPIError, ValueError) as e:  # malformed body: retry like a server error
                self._count("server_errors")
                last = str(e)
            if attempt == self.max_retries:
                break
            backoff = min(self.backoff_max_s, self.backoff_base_s * 2 ** attempt) * random.uniform(0.5, 1.0)
            wait = max(backoff, server_wait) if server_wait is not None else backoff
            self._count("retries")
            log.debug("judge: %s; retrying in %.2fs", last, wait)
            self.sleep(wait)
        raise JudgeAPIError(f"gave up after {self.max_retries + 1} attempts: {last}")


# ---------------------------------------------------------------------------- judging

def read_judgments(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError:  # a line cut by a crash: judge that item again
                    log.warning("judge: skipping a malformed line in %s", path)
    return out


def judgment_key(j: dict) -> tuple:
    return (j["question_id"], j["model"], j["judge"][0], j["judge"][1], j["turn"], prompt_hash(j.get("user_prompt", "")))


def _write_rows(path: Path, rows: Sequence[dict], mode: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    target = tmp if mode == "w" else path
    with open(target, mode, encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
        f.flush()
        os.fsync(f.fileno())
    if mode == "w":
        os.replace(tmp, path)


def reconcile_judgments(out_file: Path, matches: Sequence[Match], judge_model: str) -> set:
    """Make `out_file` hold at most one judgment per match, of the match's current prompt; return
    the keys it holds. Stale judgments go to `<file>.stale.jsonl` (nothing is lost); duplicates
    and unreadable lines (a crash in the middle of a write) are dropped, each with a warning."""
    if not out_file.is_file():
        return set()
    lines = [ln for ln in out_file.read_text(encoding="utf-8").splitlines() if ln.strip()]
    rows = read_judgments(out_file)
    current = {m.key(judge_model)[:5]: m.key(judge_model) for m in matches}
    keep, stale, seen = [], [], set()
    for r in rows:
        k = judgment_key(r)
        if current.get(k[:5], k) != k:
            stale.append(r)  # judged another answer than the one in the answer file now
        elif k not in seen:
            seen.add(k)
            keep.append(r)
    dropped = len(lines) - len(keep) - len(stale)
    if stale or dropped:
        if stale:
            _write_rows(out_file.with_suffix(".stale.jsonl"), stale, "a")
        _write_rows(out_file, keep, "w")
        log.warning("judge: %s: %d stale judgment(s) of changed answers moved to %s; %d duplicate or unreadable "
                    "line(s) dropped", out_file, len(stale), out_file.with_suffix(".stale.jsonl").name, dropped)
    return seen


def judge_all(matches: Sequence[Match], client: ChatClient, out_file: Path, concurrency: int = 4,
              temperature: float = 0.0, max_tokens: int = 2048) -> dict:
    """Judge what `out_file` does not hold yet; append each judgment as it arrives."""
    out_file.parent.mkdir(parents=True, exist_ok=True)
    done = reconcile_judgments(out_file, matches, client.model)
    todo = [m for m in matches if m.key(client.model) not in done]
    log.info("judge: %d matches, %d already judged in %s, %d to go", len(matches), len(matches) - len(todo),
             out_file, len(todo))
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[str] = []

    def one(m: Match):
        if stop.is_set():
            return None
        prompt = user_prompt(m)
        messages = [{"role": "system", "content": m.prompt["system_prompt"]}, {"role": "user", "content": prompt}]
        try:
            judgment = client.complete(messages, temperature=temperature, max_tokens=max_tokens)
        except JudgeAPIError as e:
            if not e.retryable:
                stop.set()  # e.g. a bad key or model name: every request would fail the same way
            with lock:
                errors.append(f"question {m.question['question_id']} turn {m.turn}: {e}")
            return None
        row = {"question_id": m.question["question_id"], "model": m.model,
               "judge": [client.model, m.prompt["name"]], "user_prompt": prompt, "judgment": judgment,
               "score": parse_rating(judgment), "turn": m.turn, "tstamp": time.time()}
        with lock:
            with open(out_file, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
        return row

    t0 = time.perf_counter()
    new = 0
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for fut in as_completed([pool.submit(one, m) for m in todo]):
            if fut.result() is not None:
                new += 1
    not_attempted = len(todo) - new - len(errors)  # skipped once a non-retryable error stopped the rest
    if errors:
        log.error("judge: %d request(s) failed (not written; rerun to retry them), e.g. %s", len(errors), errors[0])
    return {"matches": len(matches), "skipped_existing": len(matches) - len(todo), "judged": new,
            "failed": len(errors), "not_attempted": not_attempted, "failure_causes": failure_causes(errors),
            "errors": errors[:20], "seconds": time.perf_counter() - t0, **client.counters}


def failure_causes(errors: Sequence[str]) -> dict[str, int]:
    """Failed requests counted by cause: the HTTP status, else the exception name, else "other"."""
    causes: dict[str, int] = {}
    for e in errors:
        m = re.search(r"HTTP \d{3}|\b[A-Z]\w*(?:Error|Exception|Timeout)\b", e)
        key = m.group(0) if m else "other"
        causes[key] = causes.get(key, 0) + 1
    return dict(sorted(causes.items(), key=lambda kv: -kv[1]))


def score_table(judgments: Sequence[dict], questions: Sequence[dict], model: Optional[str] = None) -> dict:
    """Mean score by category and turn (FastChat's show_result: -1 excluded), with the standard
    error of the mean and the counts of valid and unparsable (-1) ratings."""
    cat = {q["question_id"]: q["category"] for q in questions}
    rows = [j for j in judgments if (model is None or j["model"] == model) and j["question_id"] in cat]

    def agg(sel):
        valid = [float(j["score"]) for j in sel if j["score"] != -1]
        return {"score": sum(valid) / len(valid) if valid else None, "stderr": stderr(valid), "n": len(valid),
                "invalid": sum(1 for j in sel if j["score"] == -1)}

    table = {}
    for c in sorted({cat[j["question_id"]] for j in rows}):
        sel = [j for j in rows if cat[j["question_id"]] == c]
        table[c] = {"turn1": agg([j for j in sel if j["turn"] == 1]), "turn2": agg([j for j in sel if j["turn"] == 2]),
                    "all": agg(sel)}
    overall = {"turn1": agg([j for j in rows if j["turn"] == 1]), "turn2": agg([j for j in rows if j["turn"] == 2]),
               "all": agg(rows)}
    return {"by_category": table, "overall": overall}
