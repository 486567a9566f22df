"""MT-Bench: generation of the 80 two-turn answers in FastChat's format, and (judge=openai)
single-answer grading with FastChat's judge prompts.

Generation (what FastChat's gen_model_answer.py does, through our chat template and engine):
  * turn 1 prompt = chat_template([user: turns[0]]) with the generation prompt; turn 2 prompt =
    chat_template([user: turns[0], assistant: <the model's own turn-1 answer>, user: turns[1]]);
  * temperature per category (FastChat's temperature_config: writing/roleplay 0.7,
    stem/humanities 0.1, extraction/math/coding/reasoning 0 = greedy; others 0.7), or
    `eval.temperature` for all; sampling uses a per-request seed derived from `eval.seed`, the
    question and the turn, so answers do not depend on what else is in the batch;
  * generation stops at <|eos|> or <|end|> (the end of a chat turn) or after `max_new_tokens`;
    the answer is the decoded text, stripped (FastChat strips too);
  * every question is submitted at once and turn 2 of a question is submitted the moment its
    turn 1 finishes, so the engine's continuous batching runs all conversations together;
  * a prompt longer than the model allows keeps its last tokens (FastChat's generate_stream
    does the same) and leaves room for min(max_new_tokens, max_model_len // 2) new tokens;
    the number of truncated prompts is reported.
Answer file: `<run dir>/model_answer/<model_id>.jsonl`, one line per question sorted by
question_id: {"question_id", "answer_id", "model_id", "choices": [{"index": 0, "turns": [a1, a2]}],
"tstamp"}, what FastChat's judging scripts read.
"""

from __future__ import annotations

import logging
import os
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from eval.common import (SHARED_DATA, EvalError, IncompleteEvalError, data_path_or_default, mean, read_jsonl,
                         resolve_path, shuffle_and_limit, truncation_report, write_jsonl)
from eval.generation import engine_stats, open_engine, run_requests
from eval.judge import (ChatClient, judge_all, judgment_key, load_judge_prompts, make_matches, read_judgments,
                        score_table)
from eval.tasks.base import EVAL_TASKS, EvalContext, EvalTask, SubsetConfig, one_of, positive
from moe.engine import LLM, RequestOutput, SamplingParams
from moe.errors import ConfigError
from moe.report import markdown_table

log = logging.getLogger("moe.eval")

# FastChat's `temperature_config` (fastchat/llm_judge/common.py): categories not listed get 0.7.
FASTCHAT_TEMPERATURES = {"writing": 0.7, "roleplay": 0.7, "extraction": 0.0, "math": 0.0, "coding": 0.0,
                         "reasoning": 0.0, "stem": 0.1, "humanities": 0.1, "arena-hard-200": 0.0}


@dataclass
class MTBenchConfig(SubsetConfig):
    task: str = "mt_bench"
    data_path: Optional[str] = None  # null = ../shared/data/mt_bench (question.jsonl, judge_prompts.jsonl, ...)
    model_id: Optional[str] = None  # null = <run dir name>-step<step> of the checkpoint
    answer_file: Optional[str] = None  # judge this FastChat answer file instead of generating
    max_new_tokens: int = 1024
    temperature: Optional[float] = None  # null = FastChat's per-category temperature
    temperature_config: dict = field(default_factory=lambda: dict(FASTCHAT_TEMPERATURES))
    default_temperature: float = 0.7  # categories missing from temperature_config (FastChat: 0.7)
    system_prompt: Optional[str] = None
    max_model_len: Optional[int] = None  # null = the model's max_seq_len; longer prompts are left-truncated
    max_num_seqs: int = 64  # engine: sequences decoded together
    max_num_batched_tokens: int = 2048
    on_truncation: str = "warn"  # prompts cut to fit the context: warn (count recorded) | error (no judging, exit 1)

_SHORTUUID_ALPHABET = "23456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"  # shortuuid's default


def answer_id(rng: random.Random) -> str:
    """A 22-character id like FastChat's `shortuuid.uuid()`."""
    return "".join(rng.choice(_SHORTUUID_ALPHABET) for _ in range(22))


def default_data_path() -> Path:
    return SHARED_DATA / "mt_bench"


def data_dir(cfg: MTBenchConfig) -> Path:
    return data_path_or_default(
        cfg.data_path, default_data_path(), "eval.data_path (MT-Bench)", "dir",
        "give eval.data_path=<dir> (a copy of fastchat/llm_judge/data/mt_bench of github.com/lm-sys/FastChat, "
        "with judge_prompts.jsonl from fastchat/llm_judge/data/); MT-Bench has no eval.data_path=hub")


def load_questions(path: Path) -> list[dict]:
    qfile = path / "question.jsonl"
    if not qfile.is_file():
        raise EvalError(f"eval.data_path={str(path)!r} has no question.jsonl (FastChat's mt_bench/question.jsonl)")
    return read_jsonl(qfile)


def select(questions: Sequence[dict], cfg) -> list[dict]:
    out = list(questions)
    if cfg.categories:
        known = {q["category"] for q in questions}
        missing = sorted({str(c) for c in cfg.categories} - known)
        if missing:
            raise EvalError(f"eval.categories: {missing} not in MT-Bench; known: {sorted(known)}")
        out = [q for q in out if q["category"] in set(map(str, cfg.categories))]
    if cfg.question_ids:
        known_ids = {q["question_id"] for q in questions}
        missing = sorted(set(cfg.question_ids) - known_ids)
        if missing:
            raise EvalError(f"eval.question_ids: {missing} not in MT-Bench (ids {min(known_ids)}..{max(known_ids)})")
        out = [q for q in out if q["question_id"] in set(cfg.question_ids)]
    return shuffle_and_limit(out, cfg)


def temperature_for(cfg: MTBenchConfig, category: str) -> float:
    if cfg.temperature is not None:
        return float(cfg.temperature)
    return float(cfg.temperature_config.get(category, cfg.default_temperature))


def default_model_id(ckpt_info: dict) -> str:
    if ckpt_info.get("kind") == "hf":
        base = Path(ckpt_info["path"]).name
    else:
        base = Path(ckpt_info.get("run_dir") or ckpt_info["path"]).name
    if ckpt_info.get("step") is not None:
        base += f"-step{ckpt_info['step']}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", base) or "model"


def stop_token_ids(tokenizer) -> list[int]:
    ids = [tokenizer.eos_id] if tokenizer.eos_id is not None else []
    end = tokenizer.special_ids.get("<|end|>")
    if end is not None:
        ids.append(end)
    return ids


class PromptBuilder:
    def __init__(self, tokenizer, max_model_len: int, max_new_tokens: int, system_prompt: Optional[str] = None):
        self.tok, self.max_model_len, self.system = tokenizer, max_model_len, system_prompt
        self.keep = max(1, max_model_len - min(max_new_tokens, max_model_len // 2))
        self.truncated = 0

    def __call__(self, turns: Sequence[str], answers: Sequence[str]) -> list[int]:
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        for i, q in enumerate(turns):
            msgs.append({"role": "user", "content": q})
            if i < len(answers):
                msgs.append({"role": "assistant", "content": answers[i]})
        ids = self.tok.encode(self.tok.apply_chat_template(msgs, add_generation_prompt=True))
        if len(ids) > self.keep:  # keep the last tokens, leaving room to answer
            ids = ids[-self.keep:]
            self.truncated += 1
        return ids


def generate_answers(ctx: EvalContext, questions: Sequence[dict], cfg: MTBenchConfig,
                     model_id: str) -> tuple[list[dict], dict]:
    """FastChat answer rows (sorted by question_id) and generation statistics."""
    tokenizer = ctx.tokenizer
    if tokenizer is None:
        raise EvalError("the checkpoint has no tokenizer; MT-Bench needs one (and its chat template)")
    max_model_len = cfg.max_model_len or ctx.model_cfg.max_seq_len
    with open_engine(ctx, max_model_len=max_model_len, max_num_seqs=cfg.max_num_seqs,
                     max_num_batched_tokens=cfg.max_num_batched_tokens, seed=cfg.seed) as llm:
        return _generate(llm, tokenizer, questions, cfg, model_id, max_model_len)


def _generate(llm: LLM, tokenizer, questions: Sequence[dict], cfg: MTBenchConfig, model_id: str,
              max_model_len: int) -> tuple[list[dict], dict]:
    build = PromptBuilder(tokenizer, max_model_len, cfg.max_new_tokens, cfg.system_prompt)
    stops = stop_token_ids(tokenizer)
    by_id = {q["question_id"]: q for q in questions}
    answers: dict[int, list[str]] = {q["question_id"]: [] for q in questions}
    per_turn: dict[tuple[int, int], dict] = {}

    def params(q: dict, turn: int) -> SamplingParams:
        t = temperature_for(cfg, q["category"])
        greedy = t < 1e-4  # FastChat: do_sample = temperature >= 1e-4
        return SamplingParams(max_tokens=cfg.max_new_tokens, temperature=0.0 if greedy else t,
                              seed=None if greedy else cfg.seed * 1_000_003 + q["question_id"] * 10 + turn,
                              stop_token_ids=stops or None)

    def record(key: tuple[int, int], o: RequestOutput):
        """Keep turn `turn` of question `qid`; return its next turn's request, if any."""
        qid, turn = key
        text = o.text.strip() if o.finish_reason != "error" else "ERROR"  # FastChat writes "ERROR" too
        if o.finish_reason == "error":
            log.error("mt_bench: question %s turn %d failed: %s", qid, turn + 1, o.error)
        answers[qid].append(text)
        per_turn[(qid, turn)] = {"question_id": qid, "turn": turn + 1, "category": by_id[qid]["category"],
                                 "prompt_tokens": len(o.prompt_token_ids), "output_tokens": len(o.token_ids),
                                 "finish_reason": o.finish_reason, "ttft_s": o.metrics.ttft if o.metrics else None,
                                 "e2e_s": o.metrics.e2e_latency if o.metrics else None}
        q = by_id[qid]
        if turn + 1 < len(q["turns"]):
            return [((qid, turn + 1), build(q["turns"][:turn + 2], answers[qid]), params(q, turn + 1))]
        return []

    t0 = time.perf_counter()
    run_requests(llm, [((q["question_id"], 0), build(q["turns"][:1], []), params(q, 0)) for q in questions], record)
    elapsed = time.perf_counter() - t0

    rng = random.Random(f"{cfg.seed}-{model_id}")
    tstamp = time.time()
    rows = [{"question_id": qid, "answer_id": answer_id(rng), "model_id": model_id,
             "choices": [{"index": 0, "turns": answers[qid]}], "tstamp": tstamp} for qid in sorted(answers)]
    turns = [per_turn[k] for k in sorted(per_turn)]
    out_tokens = sum(t["output_tokens"] for t in turns)
    by_cat = {}
    for c in sorted({t["category"] for t in turns}):
        sel = [t for t in turns if t["category"] == c]
        by_cat[c] = {f"turn{k}_mean_output_tokens": mean([t["output_tokens"] for t in sel if t["turn"] == k])
                     for k in (1, 2)}
    stats = {
        "generator": "engine", "seconds": elapsed, "requests": len(turns), "output_tokens": out_tokens,
        "prompt_tokens": sum(t["prompt_tokens"] for t in turns),
        "output_tokens_per_s": out_tokens / elapsed if elapsed > 0 else None,
        "mean_output_tokens": out_tokens / len(turns) if turns else None,
        "finish_reasons": {r: sum(1 for t in turns if t["finish_reason"] == r)
                           for r in sorted({t["finish_reason"] for t in turns})},
        "truncated_prompts": build.truncated, "max_model_len": max_model_len, "max_new_tokens": cfg.max_new_tokens,
        "truncation": truncation_report(
            build.truncated, len(turns), "prompts", build.keep, "they keep their last tokens, so the model answered "
            "without the start of the conversation", room=f"the {build.keep} prompt tokens the model's "
            f"{max_model_len}-token context leaves next to the answer"),
        "engine": engine_stats(llm), "by_category": by_cat, "per_turn": turns,
    }
    return rows, stats


def _check_answer_rows(rows: Sequence[dict], path: Path) -> None:
    for i, r in enumerate(rows):
        missing = [k for k in ("question_id", "model_id", "choices") if k not in r]
        if missing or not r["choices"] or "turns" not in r["choices"][0]:
            raise EvalError(f"{path}: line {i + 1} is not a FastChat answer (missing {missing or ['choices[0].turns']})")


@EVAL_TASKS.register("mt_bench")
class MTBench(EvalTask):
    Config = MTBenchConfig
    judged = True
    parallel_engine = True  # generates only through its engine: tensor_parallel_size > 1 spreads it over ranks
    resumes_in_place = True  # a rerun in the run directory asks only for the judgments still missing

    def validate(self, cfg: MTBenchConfig) -> None:
        super().validate(cfg)
        positive("eval.max_new_tokens", cfg.max_new_tokens)
        positive("eval.max_num_seqs", cfg.max_num_seqs)
        positive("eval.max_num_batched_tokens", cfg.max_num_batched_tokens)
        positive("eval.max_model_len", cfg.max_model_len, allow_none=True)
        one_of("eval.on_truncation", cfg.on_truncation, ["warn", "error"])
        for name, t in [("eval.temperature", cfg.temperature), ("eval.default_temperature", cfg.default_temperature),
                        *((f"eval.temperature_config.{k}", v) for k, v in cfg.temperature_config.items())]:
            if t is not None and (not isinstance(t, (int, float)) or t < 0):
                raise ConfigError(f"{name}={t!r} must be a number >= 0")

    def needs_model(self, cfg: MTBenchConfig) -> bool:
        return not cfg.answer_file  # judging a given answer file needs no model

    def check_inputs(self, run_cfg) -> None:
        data_dir(run_cfg.eval)

    def run(self, ctx: EvalContext) -> dict:
        ecfg: MTBenchConfig = ctx.cfg.eval
        ddir = data_dir(ecfg)
        questions = select(load_questions(ddir), ecfg)
        results: dict = {"task": "mt_bench", "checkpoint": ctx.checkpoint, "config": ctx.config,
                         "subset": {"n": len(questions), "limit": ecfg.limit, "categories": list(ecfg.categories),
                                    "question_ids": [q["question_id"] for q in questions], "shuffle": ecfg.shuffle,
                                    "seed": ecfg.seed},
                         "data": {"source": str(ddir / "question.jsonl")}}
        if ecfg.answer_file:
            rows, model_id, afile = read_answers(ecfg, questions)
            results["generation"] = None
        else:
            model_id = ecfg.model_id or default_model_id(ctx.checkpoint)
            rows, gstats = generate_answers(ctx, questions, ecfg, model_id)
            afile = write_jsonl(ctx.run_dir / "model_answer" / f"{model_id}.jsonl", rows)
            results["generation"] = gstats
            log_generation(ctx.logger, questions, rows, gstats, afile)
        results["answer_file"] = str(afile)
        results["model_id"] = model_id
        trunc = (results["generation"] or {}).get("truncation")
        if trunc and trunc["truncated"]:
            if ecfg.on_truncation == "error":
                raise IncompleteEvalError(f"eval.on_truncation=error: {trunc['warning']}; the answers are in {afile} "
                                          "but were not judged", results)
            log.warning("mt_bench: %s (eval.on_truncation=error refuses such runs)", trunc["warning"])
        if ctx.cfg.judge.name != "none":
            results["judge"] = judge = judge_answers(ctx.cfg, ctx.run_dir, questions, rows, model_id, ddir, ctx.logger)
            if judge["missing"] > ctx.cfg.judge.max_failures:
                raise IncompleteEvalError(judge_failure_summary(judge, ctx.cfg.judge.max_failures), results)
        return results


def judge_failure_summary(judge: dict, allowed: int) -> str:
    """One line: how many judgments are missing, why (counts by cause, the first error), what to do."""
    st = judge["stats"]
    causes = ", ".join(f"{k}: {v}" for k, v in st.get("failure_causes", {}).items())
    skipped = f", {st['not_attempted']} not attempted after a non-retryable error" if st.get("not_attempted") else ""
    first = f"; first: {st['errors'][0]}" if st.get("errors") else ""
    return (f"mt_bench: {judge['missing']} of {judge['n_matches']} judgments are missing ({causes or 'no error'}"
            f"{skipped}){first}; the scores in results.json cover only the {judge['n_judgments']} judged; rerun in "
            f"the same run directory to retry the missing ones, or accept up to N missing with judge.max_failures=N "
            f"(now {allowed})")


def read_answers(ecfg: MTBenchConfig, questions: Sequence[dict]) -> tuple[list[dict], str, Path]:
    """The rows of `eval.answer_file` for `questions` (in their order), its model_id, its path."""
    afile = resolve_path(ecfg.answer_file, "eval.answer_file", kind="file")
    rows = read_jsonl(afile)
    _check_answer_rows(rows, afile)
    model_id = ecfg.model_id or rows[0]["model_id"]
    have = {r["question_id"]: r for r in rows}
    missing = [q["question_id"] for q in questions if q["question_id"] not in have]
    if missing:
        raise EvalError(f"eval.answer_file={str(afile)!r} has no answer for questions {missing[:10]}")
    log.info("mt_bench: judging %d answers of %r from %s", len(questions), model_id, afile)
    return [have[q["question_id"]] for q in questions], model_id, afile


def log_generation(logger, questions: Sequence[dict], rows: Sequence[dict], gstats: dict, afile: Path) -> None:
    per_q = [[t["question_id"], t["category"], t["turn"], t["prompt_tokens"], t["output_tokens"],
              t["finish_reason"]] for t in gstats["per_turn"]]
    log.info("mt_bench: %d answers (%d requests, %d tokens) in %.1fs = %.1f tokens/s [%s]; finish %s; "
             "%d prompt(s) truncated -> %s", len(rows), gstats["requests"], gstats["output_tokens"],
             gstats["seconds"], gstats["output_tokens_per_s"] or 0, gstats["generator"], gstats["finish_reasons"],
             gstats["truncated_prompts"], afile)
    logger.summary({"mt_bench/gen_seconds": gstats["seconds"],
                    "mt_bench/gen_tokens_per_s": gstats["output_tokens_per_s"],
                    "mt_bench/mean_output_tokens": gstats["mean_output_tokens"],
                    "mt_bench/truncated_prompts": gstats["truncated_prompts"], "mt_bench/n": len(rows)})
    logger.table("mt_bench/lengths", ["question_id", "category", "turn", "prompt_tokens", "output_tokens",
                                      "finish_reason"], per_q)
    category = {q["question_id"]: q["category"] for q in questions}
    logger.table("mt_bench/answers", ["question_id", "category", "turn_1", "turn_2"],
                 [[r["question_id"], category[r["question_id"]], *(r["choices"][0]["turns"] + ["", ""])[:2]]
                  for r in rows])


def judge_answers(cfg, run_dir: Path, questions, rows, model_id: str, ddir: Path, logger) -> dict:
    """Grade `rows` with judge.* (FastChat's single-answer prompts), resuming from the judgment file."""
    j = cfg.judge
    prompts = load_judge_prompts(resolve_path(j.prompts_file or ddir / "judge_prompts.jsonl", "judge.prompts_file",
                                              kind="file"))
    need_ref = any(q["category"] in ("math", "reasoning", "coding") for q in questions)
    refs = {}
    if need_ref:
        rfile = resolve_path(j.reference_file or ddir / "reference_answer" / "gpt-4.jsonl", "judge.reference_file",
                             kind="file")
        refs = {r["question_id"]: r for r in read_jsonl(rfile)}
    answers = {model_id: {r["question_id"]: r for r in rows}}
    try:
        matches = make_matches(questions, answers, prompts, refs)
    except (KeyError, ValueError) as e:
        raise EvalError(f"cannot build the judge matches: {e}") from None
    key = os.environ.get(j.api_key_env) if j.api_key_env else None
    if not key:
        log.warning("judge: $%s is not set; sending requests without an API key", j.api_key_env)
    client = ChatClient(j.base_url, j.model, key, timeout_s=j.timeout_s, max_retries=j.max_retries,
                        backoff_base_s=j.backoff_base_s, backoff_max_s=j.backoff_max_s)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", j.model)
    out = Path(j.output_file) if j.output_file else run_dir / "model_judgment" / f"{safe}_single.jsonl"
    stats = judge_all(matches, client, out, concurrency=j.concurrency, temperature=j.temperature,
                      max_tokens=j.max_tokens)
    qids = {q["question_id"] for q in questions}
    judgments = [x for x in read_judgments(out) if x["model"] == model_id and x["question_id"] in qids
                 and x["judge"][0] == j.model]
    table = score_table(judgments, questions)
    rows_t = [[c, v["turn1"]["score"], v["turn2"]["score"], v["all"]["score"], v["all"]["stderr"], v["all"]["n"],
               v["all"]["invalid"]] for c, v in table["by_category"].items()]
    o = table["overall"]
    rows_t.append(["overall", o["turn1"]["score"], o["turn2"]["score"], o["all"]["score"], o["all"]["stderr"],
                   o["all"]["n"], o["all"]["invalid"]])
    columns = ["category", "turn1", "turn2", "mean", "stderr", "n_valid", "n_invalid"]
    present = {judgment_key(x) for x in judgments}
    missing = sum(1 for m in matches if m.key(j.model) not in present)
    log.info("mt_bench judge %s (%s): %d judged now, %d reused, %d failed, %d missing\n%s", j.model, out,
             stats["judged"], stats["skipped_existing"], stats["failed"], missing, markdown_table(columns, rows_t))
    logger.summary({"mt_bench/score": o["all"]["score"], "mt_bench/score_stderr": o["all"]["stderr"],
                    "mt_bench/score_turn1": o["turn1"]["score"],
                    "mt_bench/score_turn2": o["turn2"]["score"], "mt_bench/invalid_ratings": o["all"]["invalid"],
                    "mt_bench/judge_failures": stats["failed"], "mt_bench/judgments_missing": missing})
    logger.table("mt_bench/scores", columns, rows_t)
    return {"model": j.model, "base_url": j.base_url, "judgment_file": str(out), "scores": table,
            "n_judgments": len(judgments), "n_matches": len(matches), "missing": missing, "stats": stats}
