"""Structured-instruction following: does the answer parse as JSON and validate against the
schema the prompt asks for, and does it hold the values the instruction gives?

    python -m eval task=structured ckpt=outputs/runs/x logger=none
    python -m eval task=structured ckpt=... eval.modes=[constrained] eval.temperature=0.7

The items (`eval/data/structured.jsonl`, 34 of them) were written for this repository after
public schema examples (json-schema.org's example schemas, the OpenAI structured-outputs guide,
schema.org types as JSON schemas, common function-calling examples): each has an instruction
carrying some facts, a JSON schema (required fields, types, numeric ranges, nested objects,
arrays, enums, patterns, nullable fields) and `expected`, the values the instruction determines
(a subset of the fields where the rest is free text). The schemas use only keywords xgrammar
enforces (not `uniqueItems`, which it ignores).

Each item runs in each of `eval.modes`: `unconstrained` (plain generation) and `constrained`
(the same prompt with `SamplingParams.guided = {"json": schema}`: grammar-constrained decoding,
`moe.engine.sampling.guided`). The grammar lets a free-text string run on, and a weak model may never
close one (a greedy loop inside the quotes) before `max_new_tokens`: `eval.max_string_length`
caps such strings (no maxLength, enum, const, pattern or format of their own) in the grammar
only; answers are still scored against the schema as written. Per answer:
  * parsed: the text (stripped; failing that, its span from the first "{" to the last "}") is JSON;
  * valid: parsed, and valid under the schema (`jsonschema`, Draft 2020-12; formats unchecked);
  * field_recall: the fraction of `expected`'s leaf values found at the same place in the
    answer (strings compared case-insensitively, numbers by value; list items in any order).
Outputs: results.json (rates with standard errors, per mode and per category), answers.jsonl.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from eval.common import REPO, EvalError, read_jsonl, resolve_path, shuffle_and_limit, summarize, write_jsonl
from eval.generation import engine_stats, open_engine, run_requests
from eval.tasks.base import EVAL_TASKS, EvalContext, EvalTask, SubsetConfig, one_of, positive
from moe.engine import SamplingParams
from moe.errors import ConfigError
from moe.report import markdown_table

log = logging.getLogger("moe.eval")

DATA = REPO / "eval" / "data" / "structured.jsonl"
MODES = ["unconstrained", "constrained"]
PROMPT = "{instruction}\n\nReply with only a JSON object that matches this JSON schema:\n{schema}"


@dataclass
class StructuredConfig(SubsetConfig):
    task: str = "structured"
    data_path: Optional[str] = None  # None = eval/data/structured.jsonl
    modes: list = field(default_factory=lambda: list(MODES))
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy
    system_prompt: Optional[str] = None
    max_string_length: Optional[int] = None  # None = the schemas as written; N = free-text strings <= N chars in the grammar
    max_num_seqs: int = 64


def load_items(cfg: StructuredConfig) -> list[dict]:
    path = resolve_path(cfg.data_path, "eval.data_path", kind="file") if cfg.data_path else DATA
    items = read_jsonl(path)
    for i, it in enumerate(items):
        missing = {"id", "category", "instruction", "schema", "expected"} - set(it)
        if missing:
            raise EvalError(f"{path}: item {i} lacks {sorted(missing)}")
    if cfg.categories:
        items = [it for it in items if it["category"] in cfg.categories]
    if cfg.question_ids:
        items = [items[i] for i in cfg.question_ids if 0 <= i < len(items)]
    return shuffle_and_limit(items, cfg)


def parse_answer(text: str) -> Optional[Any]:
    """The answer as JSON: the stripped text, else its span from the first "{" to the last "}"."""
    for candidate in (text.strip(), text[text.find("{"):text.rfind("}") + 1] if "{" in text else ""):
        if candidate:
            try:
                return json.loads(candidate)
            except ValueError:
                pass
    return None


def leaves(value: Any, path: str = "") -> list[tuple[str, Any]]:
    """(path, value) of every scalar in `value`; list items get the path "<list>[]"."""
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in leaves(v, f"{path}.{k}" if path else k)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in leaves(v, f"{path}[]")]
    return [(path, value)]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().casefold() == b.strip().casefold()
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))
    return False


def field_recall(expected: Any, answer: Any) -> float:
    """The fraction of `expected`'s leaves matched by a distinct leaf of `answer` at the same path."""
    want = leaves(expected)
    have = leaves(answer) if answer is not None else []
    used = [False] * len(have)
    hits = 0
    for path, v in want:
        for j, (p, w) in enumerate(have):
            if not used[j] and p == path and _same(v, w):
                used[j] = True
                hits += 1
                break
    return hits / len(want) if want else 1.0


def score(item: dict, text: str) -> dict:
    import jsonschema  # lazy: only this task needs it

    answer = parse_answer(text)
    valid = answer is not None and jsonschema.Draft202012Validator(item["schema"]).is_valid(answer)
    return {"parsed": float(answer is not None), "valid": float(valid),
            "field_recall": field_recall(item["expected"], answer)}


FREE_TEXT_BOUNDS = ("maxLength", "enum", "const", "pattern", "format")
SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")


def cap_strings(schema: Any, n: int) -> Any:
    """A copy of `schema` whose free-text strings have `maxLength: n` (a stricter schema: what
    validates under it validates under `schema`)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    types = out.get("type")
    if (types == "string" or isinstance(types, list) and "string" in types) and \
            not any(k in out for k in FREE_TEXT_BOUNDS):
        out["maxLength"] = n
    for key in SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: cap_strings(v, n) for k, v in out[key].items()}
    for key in SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [cap_strings(v, n) for v in out[key]]
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = cap_strings(out[key], n)
    return out


def prompt_ids(item: dict, tokenizer, system_prompt: Optional[str]) -> list[int]:
    schema = json.dumps(item["schema"], ensure_ascii=False, separators=(",", ":"))  # compact: fewer prompt tokens
    text = PROMPT.format(instruction=item["instruction"], schema=schema)
    messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + \
        [{"role": "user", "content": text}]
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


@EVAL_TASKS.register("structured")
class Structured(EvalTask):
    parallel_engine = True  # generates only through its engine: tensor_parallel_size > 1 spreads it over ranks
    Config = StructuredConfig

    def validate(self, cfg: StructuredConfig) -> None:
        super().validate(cfg)
        if not cfg.modes or not isinstance(cfg.modes, list):
            raise ConfigError(f"eval.modes={cfg.modes!r} must be a non-empty list of {MODES}")
        for m in cfg.modes:
            one_of("eval.modes[]", m, MODES)
        positive("eval.max_new_tokens", cfg.max_new_tokens)
        positive("eval.max_num_seqs", cfg.max_num_seqs)
        positive("eval.max_string_length", cfg.max_string_length, allow_none=True)
        if cfg.temperature < 0:
            raise ConfigError(f"eval.temperature={cfg.temperature!r} must be >= 0 (0 = greedy)")

    def run(self, ctx: EvalContext) -> dict:
        e: StructuredConfig = ctx.cfg.eval
        tokenizer = ctx.tokenizer
        if tokenizer is None:
            raise EvalError("task=structured needs the checkpoint's tokenizer (prompts are text)")
        items = load_items(e)
        prompts = {it["id"]: prompt_ids(it, tokenizer, e.system_prompt) for it in items}
        longest = max(len(p) for p in prompts.values()) + e.max_new_tokens
        requests = []
        for mode in e.modes:
            for i, it in enumerate(items):
                schema = it["schema"] if e.max_string_length is None else cap_strings(it["schema"], e.max_string_length)
                guided = {"json": schema} if mode == "constrained" else None
                params = SamplingParams(temperature=e.temperature, max_tokens=e.max_new_tokens,
                                        seed=e.seed * 1_000_003 + i, guided=guided)
                requests.append(((mode, it["id"]), prompts[it["id"]], params))
        # Schemas make long prompts: let the engine run past the model's context (with a warning) rather than cut them.
        with open_engine(ctx, max_model_len=max(longest, ctx.model_cfg.max_seq_len), max_num_seqs=e.max_num_seqs,
                         seed=e.seed, allow_long_context=True) as llm:
            t0 = time.perf_counter()
            outs = run_requests(llm, requests)
            gen_s = time.perf_counter() - t0
            stats = engine_stats(llm)
        rows, per_mode = [], {}
        for mode in e.modes:
            scores = []
            for it in items:
                o = outs[(mode, it["id"])]
                if o.finish_reason == "error":
                    raise EvalError(f"generation failed for {it['id']} ({mode}): {o.error}")
                s = score(it, o.text)
                scores.append(s)
                rows.append({"mode": mode, "id": it["id"], "category": it["category"], "answer": o.text,
                             "finish_reason": o.finish_reason, "num_tokens": len(o.token_ids), **s})
            per_mode[mode] = self.summary(items, scores, [r for r in rows if r["mode"] == mode])
        write_jsonl(ctx.run_dir / "answers.jsonl", rows)
        columns = ["mode", "parse_rate", "valid_rate", "field_recall", "stopped"]
        table = [[m, r["parse_rate"], r["valid_rate"], r["field_recall"], r["finish_reasons"].get("stop", 0)]
                 for m, r in per_mode.items()]
        log.info("structured outputs (%d items, temperature %s, %.1fs):\n%s", len(items), e.temperature, gen_s,
                 markdown_table(columns, table))
        ctx.logger.table("structured/table", columns, table)
        ctx.logger.summary({f"structured/{m}/{k}": r[k] for m, r in per_mode.items()
                            for k in ("parse_rate", "valid_rate", "field_recall")})
        return {"task": "structured", "num_items": len(items), "modes": per_mode, "checkpoint": ctx.checkpoint,
                "config": ctx.config, "data": str(Path(e.data_path) if e.data_path else DATA),
                "timing": {"generation_seconds": gen_s, "engine": stats}}

    @staticmethod
    def summary(items: list[dict], scores: list[dict], rows: list[dict]) -> dict:
        out = summarize({"parse_rate": [s["parsed"] for s in scores], "valid_rate": [s["valid"] for s in scores],
                         "field_recall": [s["field_recall"] for s in scores]})
        finish: dict[str, int] = {}
        for r in rows:
            finish[r["finish_reason"]] = finish.get(r["finish_reason"], 0) + 1
        by_cat: dict[str, dict] = {}
        for it, s in zip(items, scores):
            by_cat.setdefault(it["category"], {"n": 0, "valid": 0.0, "field_recall": 0.0})
            c = by_cat[it["category"]]
            c["n"] += 1
            c["valid"] += s["valid"]
            c["field_recall"] += s["field_recall"]
        out["finish_reasons"] = finish
        out["mean_tokens"] = sum(r["num_tokens"] for r in rows) / len(rows)
        out["by_category"] = {k: {"n": c["n"], "valid_rate": c["valid"] / c["n"],
                                  "field_recall": c["field_recall"] / c["n"]} for k, c in sorted(by_cat.items())}
        return out
