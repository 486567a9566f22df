"""Typed evaluation config: `configs/eval.yaml` + `configs/task/<task>.yaml` (package `eval`)
+ `configs/judge/<judge>.yaml` + the training `configs/logger/` group, merged onto dataclasses so
an unknown key or a bad value is a ConfigError naming it (as in training). `eval.*` is merged onto
the dataclass of the task that `eval.task` names in `EVAL_TASKS`, and checked by that task."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from eval.tasks import EVAL_TASKS
from eval.tasks.base import positive
from moe.config import LoggerConfig
from moe.errors import ConfigError
from moe.perf import run_dtype
from moe.quant import NONE, QuantSpec, sweep_specs


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
    max_failures: int = 0  # judgments allowed to be missing (failed requests) before the run exits with status 1


@dataclass
class RoutingOverrides:
    """`router.*` on the eval command line: evaluate the loaded model routed differently, without
    retraining (`Transformer.set_routing`); null keeps the checkpoint's setting."""

    top_k: Optional[int] = None  # experts per token
    drop_experts: Optional[list] = None  # experts removed from every router, e.g. [1,5]
    renormalize: Optional[bool] = None  # divide the top-k weights by their sum

    def as_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass
class QuantOverrides:
    """`quant=<scheme>` (configs/quant/) and `quant.*`: evaluate the model quantized
    (`moe.quant`); `schemes` is the list `task=quant_sweep` compares. `options` are the scheme's
    own (`quant.group_size`, ...; null ones: the scheme's default), refused by a scheme without them."""

    scheme: str = "none"
    schemes: list = field(default_factory=list)
    options: dict = field(default_factory=dict)

    @classmethod
    def from_raw(cls, raw: Any) -> "QuantOverrides":
        d = OmegaConf.to_container(raw) if isinstance(raw, DictConfig) else dict(raw or {})
        scheme, schemes = d.pop("scheme", "none"), d.pop("schemes", None) or []
        if not isinstance(schemes, list):
            raise ConfigError(f"quant.schemes={schemes!r} must be a list, e.g. [none,int8,int4]")
        return cls(str(scheme), schemes, {k: v for k, v in d.items() if v is not None})

    @property
    def calib_path(self) -> Optional[str]:
        return self.options.get("calib_path")

    def spec(self, scheme: Optional[str] = None) -> QuantSpec:
        """The chosen scheme's spec; with `scheme`, that member of a quant_sweep (each takes the options it has)."""
        if scheme is not None:
            return sweep_specs([scheme, *map(str, self.schemes)], self.options)[scheme]
        if self.scheme == NONE and self.schemes:  # a sweep: the options belong to its schemes
            return QuantSpec(NONE)
        return QuantSpec(self.scheme, **self.options)


@dataclass
class EvalRunConfig:
    ckpt: Optional[str]  # None only when the task needs no model (MT-Bench judging eval.answer_file)
    eval: Any  # the task's Config dataclass (EVAL_TASKS.get(eval.task).Config)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) or a name of moe.dtypes.DTYPES: fp32 | bf16 | fp16 ...
    tf32: bool = True  # on CUDA, fp32 matmuls may use TF32 tensor cores (moe.perf.device_defaults)
    router: RoutingOverrides = field(default_factory=RoutingOverrides)
    quant: QuantOverrides = field(default_factory=QuantOverrides)
    overwrite: bool = False  # `eval.overwrite`: replace an existing hydra.run.dir's outputs (moved aside, never deleted)
    # The engine over several processes (docs/guides/multi_device.md): taken by the tasks that generate
    # only through their engine (mt_bench, structured), refused by the others (`_refuse_parallel`).
    tensor_parallel_size: int = 1
    expert_parallel: bool = False

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
                          "device, dtype, tf32, router.*, quant.*, tensor_parallel_size, expert_parallel")
    ev = raw.get("eval") or OmegaConf.create({})
    # `eval.overwrite` is the command's, not the task's: every task takes it (configs/eval.yaml)
    overwrite = ev.get("overwrite", False)
    ev = OmegaConf.masked_copy(ev, [k for k in ev.keys() if k != "overwrite"])
    task = EVAL_TASKS.get(ev.get("task"))()  # an unknown task: a ConfigError listing the registered ones
    eval_cfg = _merge(task.Config, ev, "eval")
    ckpt = None if OmegaConf.is_missing(raw, "ckpt") else raw.get("ckpt")
    if ckpt is None or str(ckpt).strip() in ("", "none", "null"):
        ckpt = None
        if task.needs_model(eval_cfg):
            raise ConfigError(f"ckpt is required: python -m eval task=<{'|'.join(EVAL_TASKS)}> "
                              "ckpt=<checkpoint file | run dir | HF directory>")
    cfg = EvalRunConfig(
        ckpt=None if ckpt is None else str(ckpt),
        eval=eval_cfg,
        judge=_merge(JudgeConfig, raw.get("judge") or {}, "judge"),
        logger=_merge(LoggerConfig, raw.get("logger") or {}, "logger"),
        device=str(raw.get("device", "auto")),
        dtype=str(raw.get("dtype", "auto")),
        tf32=raw.get("tf32", True),
        router=_merge(RoutingOverrides, raw.get("router") or {}, "router"),
        quant=QuantOverrides.from_raw(raw.get("quant")),
        overwrite=overwrite,
        tensor_parallel_size=raw.get("tensor_parallel_size", 1),
        expert_parallel=raw.get("expert_parallel", False),
    )
    return validate(cfg)


def validate(cfg: EvalRunConfig) -> EvalRunConfig:
    """The checks of the run's own fields and judge.*; the task checks eval.*."""
    task = EVAL_TASKS.get(cfg.task)()
    _refuse_parallel(cfg)  # first: a task that cannot run on several ranks is refused whatever else it is given
    task.validate(cfg.eval)
    run_dtype(torch.device("cpu"), cfg.dtype, field="dtype")  # a bad name: an error listing auto and the names
    if not isinstance(cfg.overwrite, bool):
        raise ConfigError(f"eval.overwrite={cfg.overwrite!r} must be true or false")
    if not isinstance(cfg.tf32, bool):
        raise ConfigError(f"tf32={cfg.tf32!r} must be true or false")
    r = cfg.router
    positive("router.top_k", r.top_k, allow_none=True)
    if r.drop_experts is not None and not (isinstance(r.drop_experts, list) and all(
            isinstance(e, int) and not isinstance(e, bool) for e in r.drop_experts)):
        raise ConfigError(f"router.drop_experts={r.drop_experts!r} must be a list of expert ids, e.g. [1,5]")
    cfg.quant.spec()  # an unknown scheme or a bad field: a ConfigError naming it
    for name in cfg.quant.schemes:
        cfg.quant.spec(str(name))
    if cfg.logger.name not in ("wandb", "none"):
        raise ConfigError(f"logger.name={cfg.logger.name!r} is not allowed; choose one of ['wandb', 'none']")
    j = cfg.judge
    if j.name not in ("none", "openai"):
        raise ConfigError(f"judge.name={j.name!r} is not allowed; choose one of ['none', 'openai']")
    if j.name != "none":
        if not task.judged:
            judged = [name for name in EVAL_TASKS if EVAL_TASKS.lookup(name).judged]
            raise ConfigError(f"judge={j.name} only applies to task={'|'.join(judged)} (got task={cfg.task})")
        positive("judge.concurrency", j.concurrency)
        positive("judge.timeout_s", j.timeout_s)
        positive("judge.max_tokens", j.max_tokens)
        if j.max_failures < 0:
            raise ConfigError(f"judge.max_failures={j.max_failures!r} must be >= 0")
        if j.max_retries < 0:
            raise ConfigError(f"judge.max_retries={j.max_retries!r} must be >= 0")
        if not str(j.base_url).startswith(("http://", "https://")):
            raise ConfigError(f"judge.base_url={j.base_url!r} must be an http(s) URL, e.g. http://127.0.0.1:8000/v1")
    return cfg


def _refuse_parallel(cfg: EvalRunConfig) -> None:
    """`tensor_parallel_size=T > 1` runs a task that generates only through its engine
    (`EvalTask.parallel_engine`) on T ranks; a task that runs the model loaded in this process
    (log-likelihoods, logits, hooks) cannot spread it and is refused, naming the task and the field."""
    T, ep = cfg.tensor_parallel_size, cfg.expert_parallel
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise ConfigError(f"tensor_parallel_size={T!r} must be an integer >= 1")
    if not isinstance(ep, bool):
        raise ConfigError(f"expert_parallel={ep!r} must be true or false")
    if T == 1:
        if ep:
            raise ConfigError("expert_parallel=true needs tensor_parallel_size > 1 (with one rank it places nothing); "
                              "add tensor_parallel_size=N or drop expert_parallel")
        return
    shown = f"tensor_parallel_size={T}" + (" expert_parallel=true" if ep else "")
    task = EVAL_TASKS.get(cfg.task)
    if not task.parallel_engine:
        engines = "|".join(name for name in EVAL_TASKS if EVAL_TASKS.lookup(name).parallel_engine)
        raise ConfigError(f"{shown} is not supported by task={cfg.task}: it runs the model loaded in this process "
                          f"(log-likelihoods, logits or hooks), which cannot be spread over ranks; use "
                          f"tensor_parallel_size=1, or a generation task (task={engines})")
    if cfg.quant.scheme != NONE or cfg.quant.schemes:
        quant = f"quant={cfg.quant.scheme}" if cfg.quant.scheme != NONE else f"quant.schemes={list(cfg.quant.schemes)}"
        raise ConfigError(f"{quant} is not supported with {shown}: the multi-rank engine serves the weights as "
                          "stored; use quant=none or tensor_parallel_size=1")


def to_dict(cfg: EvalRunConfig) -> dict:
    return dataclasses.asdict(cfg)
