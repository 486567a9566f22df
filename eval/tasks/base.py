"""The evaluation-task registry and what a task is.

A task is a class registered in `EVAL_TASKS` under its `task=` name. It owns the dataclass that
`eval.*` is merged onto (`Config`), the checks beyond that dataclass's types (`validate`), what
it needs (`needs_model`: MT-Bench judging a given answer file loads no model) and whether
`judge=<name>` applies to it (`judged`); `run` gets an `EvalContext` and returns the results
that `python -m eval` writes to `<run dir>/results.json`. `eval/__main__.py` knows nothing else
about any task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Optional

import torch

from moe.errors import ConfigError
from moe.registry import Registry

EVAL_TASKS: Registry = Registry("task", package="eval.tasks")


@dataclass
class SubsetConfig:
    """Which items to evaluate: filters in file order, then (optionally) a seeded shuffle, then
    the first `limit` (lm-evaluation-harness's --limit when nothing else is set). Every task's
    config subclasses it and adds `task: str = "<its name>"` (the key `configs/task/<name>.yaml`
    sets, and the one the run directory is named after)."""

    limit: Optional[int] = None
    categories: list = field(default_factory=list)  # [] = all
    question_ids: list = field(default_factory=list)  # [] = all (TruthfulQA: 0-based row indices)
    shuffle: bool = False  # a random subset: shuffle with `seed` before `limit`
    seed: int = 0


@dataclass
class EvalContext:
    """What a task's `run` gets."""

    cfg: Any  # the whole eval.config.EvalRunConfig: cfg.eval is the task's Config, cfg.judge, cfg.logger
    config: dict  # the same, as the plain dict results.json records
    run_dir: Path
    model: Optional[torch.nn.Module]  # None when the task's needs_model(cfg.eval) is False
    tokenizer: Any
    checkpoint: dict  # moe.loading.describe_checkpoint(ckpt), plus params / load_seconds when loaded
    logger: Any  # eval.common.EvalLogger (W&B, or no-ops with logger=none)
    device: torch.device
    # The checkpoint's model config and the run's dtype: what a task building an engine from the
    # checkpoint path needs when `model` is None (tensor_parallel_size > 1: eval.generation.open_engine).
    model_cfg: Any = None
    dtype: Optional[torch.dtype] = None


class EvalTask:
    """Base class of the registered tasks (see the module docstring)."""

    Config: ClassVar[type] = SubsetConfig
    judged: ClassVar[bool] = False  # judge=<name> applies (else only judge=none is allowed)
    # a rerun in the same run directory continues the run (MT-Bench retries missing judgments)
    resumes_in_place: ClassVar[bool] = False
    # it runs the model only through an engine built by `eval.generation.open_engine`, so
    # `tensor_parallel_size > 1` spreads it over ranks; else T > 1 is refused (it runs the model
    # loaded in this process: log-likelihoods, logits, hooks)
    parallel_engine: ClassVar[bool] = False

    def validate(self, cfg) -> None:
        """Checks of `cfg` (a `Config`) beyond its types; a ConfigError naming `eval.<field>`.
        Subclasses call `super().validate(cfg)` for the subset fields."""
        positive("eval.limit", cfg.limit, allow_none=True)
        for name in ("categories", "question_ids"):
            v = getattr(cfg, name)
            if not isinstance(v, list):
                raise ConfigError(f"eval.{name}={v!r} must be a list, e.g. eval.{name}=[a,b]")
        if cfg.question_ids and not all(isinstance(q, int) and not isinstance(q, bool) for q in cfg.question_ids):
            raise ConfigError(f"eval.question_ids={cfg.question_ids!r} must be a list of ints")

    def check_inputs(self, run_cfg) -> None:
        """Checks of what the run reads and of the run-wide options it uses (`run_cfg` is the whole
        eval.config.EvalRunConfig), made before anything is loaded or any output directory exists:
        a missing data file is refused here, not after the checkpoint has loaded."""

    def needs_model(self, cfg) -> bool:
        """Whether this run loads the checkpoint (`ckpt` is then required)."""
        return True

    def run(self, ctx: EvalContext) -> dict:
        raise NotImplementedError


def positive(name: str, v: Any, allow_none: bool = False) -> None:
    """A ConfigError naming `name` unless `v` is a number > 0 (or None, when allowed)."""
    if v is None and allow_none:
        return
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise ConfigError(f"{name}={v!r} must be > 0")


def one_of(name: str, v: Any, allowed: list) -> None:
    """A ConfigError naming `name` and the allowed values unless `v` is one of them."""
    if v not in allowed:
        raise ConfigError(f"{name}={v!r} is not allowed; choose one of {allowed}")
