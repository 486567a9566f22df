"""Typed evaluation config: `configs/eval.yaml` + `configs/task/<task>.yaml` (package `eval`)
+ `configs/judge/<judge>.yaml` + the training `configs/logger/` group, merged onto these
dataclasses so an unknown key or a bad value is a ConfigError naming it (as in training)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from moe.config import ConfigError, LoggerConfig

# FastChat's `temperature_config` (fastchat/llm_judge/common.py): categories not listed get 0.7.
FASTCHAT_TEMPERATURES = {"writing": 0.7, "roleplay": 0.7, "extraction": 0.0, "math": 0.0, "coding": 0.0,
                         "reasoning": 0.0, "stem": 0.1, "humanities": 0.1}


@dataclass
class SubsetConfig:
    """Which items to evaluate: filters in file order, then (optionally) a seeded shuffle, then
    the first `limit` (lm-evaluation-harness's --limit when nothing else is set)."""

    limit: Optional[int] = None
    categories: list = field(default_factory=list)  # [] = all
    question_ids: list = field(default_factory=list)  # [] = all (TruthfulQA: 0-based row indices)
    shuffle: bool = False  # a random subset: shuffle with `seed` before `limit`
    seed: int = 0


@dataclass
class TruthfulQAConfig(SubsetConfig):
    task: str = "truthfulqa"
    # null = the local copy of `version` (../shared/data/truthfulqa[/v0]); "hub" = the HF hub dataset
    # through `datasets`; else a directory with mc_task.json (+ TruthfulQA.csv) or multiple_choice.jsonl.
    data_path: Optional[str] = None
    version: str = "v0"  # v0 (817 questions: HF hub / lm-eval-harness) | 2025 (790 questions)
    hub_name: str = "truthfulqa/truthful_qa"
    batch_size: int = 32  # sequences per forward
    max_length: Optional[int] = None  # null = the model's max_seq_len (the harness: max_position_embeddings)
    mc2_split: str = "labels"  # labels (the harness's mc2 v3.0) | first_zero (its mc2 v2.0: before the first 0)


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


@dataclass
class SamplingSweepConfig(SubsetConfig):
    task: str = "sampling_sweep"
    top_ps: list = field(default_factory=lambda: [0.3, 0.5, 0.7, 0.9, 0.99])
    temperature: float = 1.0
    num_samples: int = 32  # per top-p
    max_new_tokens: int = 64
    prompts: list = field(default_factory=list)  # [] = unconditional (start after <|eos|>, a document boundary)
    max_num_seqs: int = 64


@dataclass
class JudgeConfig:
    name: str = "none"  # none | openai (any OpenAI-compatible chat-completions endpoint)
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "gpt-4"
    api_key_env: str = "OPENAI_API_KEY"  # the key is read from this environment variable
    concurrency: int = 4
    max_retries: int = 8  # per request, on 429 / 5xx / connection errors
    backoff_base_s: float = 1.0  # exponential backoff: base * 2^attempt (capped), or the server's reset header
    backoff_max_s: float = 60.0
    timeout_s: float = 120.0
    temperature: float = 0.0
    max_tokens: int = 2048
    prompts_file: Optional[str] = None  # null = <mt_bench data>/judge_prompts.jsonl
    reference_file: Optional[str] = None  # null = <mt_bench data>/reference_answer/gpt-4.jsonl
    output_file: Optional[str] = None  # null = <run dir>/model_judgment/<judge.model>_single.jsonl


TASK_CONFIGS = {"truthfulqa": TruthfulQAConfig, "mt_bench": MTBenchConfig, "sampling_sweep": SamplingSweepConfig}


@dataclass
class EvalRunConfig:
    ckpt: Optional[str]  # None only for task=mt_bench with eval.answer_file (judging, no model)
    eval: Any  # one of TASK_CONFIGS
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "fp32"  # fp32 | bf16

    @property
    def task(self) -> str:
        return self.eval.task


def _merge(schema, raw, prefix: str):
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), raw))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or ""
        msg = str(e).splitlines()[0]
        full = f"{prefix}.{key}" if key else prefix
        if "not in" in msg or ("Key" in msg and "not" in msg):
            raise ConfigError(f"unknown config key {full!r}: {msg}") from None
        raise ConfigError(f"bad value for {full!r}: {msg}") from None


def load_eval_config(raw: Any) -> EvalRunConfig:
    """Merge a composed Hydra config (or a dict) onto the schema and validate it."""
    if not isinstance(raw, DictConfig):
        raw = OmegaConf.create(raw)
    raw = OmegaConf.masked_copy(raw, [k for k in raw.keys() if k != "hydra"])
    unknown = sorted(set(raw.keys()) - {f.name for f in dataclasses.fields(EvalRunConfig)})
    if unknown:
        raise ConfigError(f"unknown top-level config key(s) {unknown}; known: ckpt, eval.*, judge.*, logger.*, "
                          "device, dtype")
    ev = raw.get("eval") or OmegaConf.create({})
    task = ev.get("task")
    if task not in TASK_CONFIGS:
        raise ConfigError(f"eval.task={task!r} is not allowed; choose one of {sorted(TASK_CONFIGS)} "
                          "(select it with task=<name>)")
    ckpt = None if OmegaConf.is_missing(raw, "ckpt") else raw.get("ckpt")
    if ckpt is None or str(ckpt).strip() in ("", "none", "null"):
        ckpt = None
        if not (task == "mt_bench" and ev.get("answer_file")):  # judging a given answer file needs no model
            raise ConfigError("ckpt is required: python -m eval task=<truthfulqa|mt_bench|sampling_sweep> "
                              "ckpt=<checkpoint file | run dir | HF directory>")
    cfg = EvalRunConfig(
        ckpt=None if ckpt is None else str(ckpt),
        eval=_merge(TASK_CONFIGS[task], ev, "eval"),
        judge=_merge(JudgeConfig, raw.get("judge") or {}, "judge"),
        logger=_merge(LoggerConfig, raw.get("logger") or {}, "logger"),
        device=str(raw.get("device", "auto")),
        dtype=str(raw.get("dtype", "fp32")),
    )
    return validate(cfg)


def validate(cfg: EvalRunConfig) -> EvalRunConfig:
    e = cfg.eval

    def positive(name, v, allow_none=False):
        if v is None and allow_none:
            return
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise ConfigError(f"{name}={v!r} must be > 0")

    positive("eval.limit", e.limit, allow_none=True)
    for name in ("categories", "question_ids"):
        v = getattr(e, name)
        if not isinstance(v, list):
            raise ConfigError(f"eval.{name}={v!r} must be a list, e.g. eval.{name}=[a,b]")
    if e.question_ids and not all(isinstance(q, int) and not isinstance(q, bool) for q in e.question_ids):
        raise ConfigError(f"eval.question_ids={e.question_ids!r} must be a list of ints")
    if cfg.dtype not in ("fp32", "bf16", "fp16"):
        raise ConfigError(f"dtype={cfg.dtype!r} is not allowed; choose one of ['fp32', 'bf16', 'fp16']")
    if cfg.logger.name not in ("wandb", "none"):
        raise ConfigError(f"logger.name={cfg.logger.name!r} is not allowed; choose one of ['wandb', 'none']")
    if isinstance(e, TruthfulQAConfig):
        positive("eval.batch_size", e.batch_size)
        positive("eval.max_length", e.max_length, allow_none=True)
        if e.version not in ("v0", "2025"):
            raise ConfigError(f"eval.version={e.version!r} is not allowed; choose one of ['v0', '2025']")
        if e.mc2_split not in ("first_zero", "labels"):
            raise ConfigError(f"eval.mc2_split={e.mc2_split!r} is not allowed; choose one of ['first_zero', 'labels']")
    elif isinstance(e, MTBenchConfig):
        positive("eval.max_new_tokens", e.max_new_tokens)
        positive("eval.max_num_seqs", e.max_num_seqs)
        positive("eval.max_num_batched_tokens", e.max_num_batched_tokens)
        positive("eval.max_model_len", e.max_model_len, allow_none=True)
        for name, t in [("eval.temperature", e.temperature), ("eval.default_temperature", e.default_temperature),
                        *((f"eval.temperature_config.{k}", v) for k, v in e.temperature_config.items())]:
            if t is not None and (not isinstance(t, (int, float)) or t < 0):
                raise ConfigError(f"{name}={t!r} must be a number >= 0")
    elif isinstance(e, SamplingSweepConfig):
        positive("eval.num_samples", e.num_samples)
        positive("eval.max_new_tokens", e.max_new_tokens)
        positive("eval.temperature", e.temperature)
        positive("eval.max_num_seqs", e.max_num_seqs)
        if not e.top_ps or not all(isinstance(p, (int, float)) and 0 < p <= 1 for p in e.top_ps):
            raise ConfigError(f"eval.top_ps={e.top_ps!r} must be a non-empty list of numbers in (0, 1]")
    j = cfg.judge
    if j.name not in ("none", "openai"):
        raise ConfigError(f"judge.name={j.name!r} is not allowed; choose one of ['none', 'openai']")
    if j.name != "none":
        if not isinstance(cfg.eval, MTBenchConfig):
            raise ConfigError(f"judge={j.name} only applies to task=mt_bench (got task={cfg.task})")
        positive("judge.concurrency", j.concurrency)
        positive("judge.timeout_s", j.timeout_s)
        positive("judge.max_tokens", j.max_tokens)
        if j.max_retries < 0:
            raise ConfigError(f"judge.max_retries={j.max_retries!r} must be >= 0")
        if not str(j.base_url).startswith(("http://", "https://")):
            raise ConfigError(f"judge.base_url={j.base_url!r} must be an http(s) URL, e.g. http://127.0.0.1:8000/v1")
    return cfg


def to_dict(cfg: EvalRunConfig) -> dict:
    return dataclasses.asdict(cfg)
