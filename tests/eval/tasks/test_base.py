"""The evaluation-task registry (eval/tasks/base.py): every module of eval/tasks registers one
task, each task has its configs/task/<name>.yaml with exactly its config's fields and defaults,
an unknown task lists the known ones, and a new task needs nothing but its class (and yaml):
`run_eval` merges, checks, loads and runs it without knowing it."""

from __future__ import annotations

import dataclasses
import json
import pkgutil
import re
from dataclasses import dataclass

import pytest
from omegaconf import OmegaConf

import eval.tasks
from eval.__main__ import run_eval
from eval.tasks import EVAL_TASKS, EvalContext, EvalTask, SubsetConfig
from eval.tasks.base import positive
from moe.errors import ConfigError
from tests.eval.conftest import REPO

TASK_YAMLS = REPO / "configs" / "task"


def test_every_task_module_registers_its_task():
    modules = {f"eval.tasks.{m.name}" for m in pkgutil.iter_modules(eval.tasks.__path__) if m.name != "base"}
    registered = {EVAL_TASKS.lookup(name).__module__ for name in EVAL_TASKS}
    assert registered == modules and len(EVAL_TASKS) == len(modules)


def test_every_task_has_its_yaml_with_exactly_its_config_fields_and_defaults():
    assert {p.stem for p in TASK_YAMLS.glob("*.yaml")} == set(EVAL_TASKS)
    for name in EVAL_TASKS:
        task = EVAL_TASKS.lookup(name)
        assert issubclass(task, EvalTask) and issubclass(task.Config, SubsetConfig)
        yaml = OmegaConf.to_container(OmegaConf.load(TASK_YAMLS / f"{name}.yaml"))
        defaults = dataclasses.asdict(task.Config())
        assert yaml == defaults, name  # same keys (none missing, none extra) and the same values
        assert defaults["task"] == name


def test_an_unknown_task_lists_the_known_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"task='nope' is unknown; choose one of "
                                          + re.escape(str(sorted(EVAL_TASKS)))):
        run_eval({"ckpt": "x", "eval": {"task": "nope"}, "logger": {"name": "none"}}, tmp_path)
    with pytest.raises(ConfigError, match=r"task=None is unknown"):
        run_eval({"ckpt": "x", "logger": {"name": "none"}}, tmp_path)


# ---------------------------------------------------------------------------- a new task

@dataclass
class CountConfig(SubsetConfig):
    task: str = "count_params"
    scale: float = 1.0
    model: bool = True  # false: a run that needs no checkpoint


class CountParams(EvalTask):
    """A throwaway task: the model's parameter count times eval.scale."""

    Config = CountConfig

    def validate(self, cfg: CountConfig) -> None:
        super().validate(cfg)
        positive("eval.scale", cfg.scale)

    def needs_model(self, cfg: CountConfig) -> bool:
        return cfg.model

    def run(self, ctx: EvalContext) -> dict:
        n = sum(p.numel() for p in ctx.model.parameters()) if ctx.model is not None else 0
        (ctx.run_dir / "count.txt").write_text(str(n))
        return {"task": "count_params", "n": n * ctx.cfg.eval.scale, "checkpoint": ctx.checkpoint,
                "config": ctx.config, "limit": ctx.cfg.eval.limit, "device": str(ctx.device)}


@pytest.fixture
def count_task(monkeypatch):
    """CountParams registered for this test only (the registry's table is restored after it)."""
    monkeypatch.setattr(EVAL_TASKS, "_items", dict(EVAL_TASKS._items))
    EVAL_TASKS.register("count_params")(CountParams)
    return CountParams


def test_a_new_task_needs_only_its_class(tmp_path, tiny, tiny_run, count_task):
    model, _, _ = tiny
    raw = {"ckpt": str(tiny_run), "eval": {"task": "count_params", "scale": 2, "limit": 3}, "logger": {"name": "none"}}
    res = run_eval(raw, tmp_path / "a")
    assert res["n"] == 2 * sum(p.numel() for p in model.parameters()) and res["limit"] == 3
    assert res["device"] == "cpu" and res["checkpoint"]["kind"] == "moe-lab" and res["checkpoint"]["step"] == 8
    assert res["checkpoint"]["params"] == model.num_params()
    assert res["checkpoint"]["dtype"] == "fp32" and res["config"]["dtype"] == "auto"  # auto on a CPU: fp32
    assert res["config"]["eval"] == {"limit": 3, "categories": [], "question_ids": [], "shuffle": False, "seed": 0,
                                     "task": "count_params", "scale": 2.0, "model": True}
    assert json.loads((tmp_path / "a" / "results.json").read_text()) == res
    assert (tmp_path / "a" / "count.txt").read_text() == str(sum(p.numel() for p in model.parameters()))
    # Its fields are merged and checked like the built-in tasks'.
    with pytest.raises(ConfigError, match="unknown config key 'eval.scalee'"):
        run_eval({**raw, "eval": {"task": "count_params", "scalee": 2}}, tmp_path / "b")
    with pytest.raises(ConfigError, match="eval.scale=-1.0 must be > 0"):
        run_eval({**raw, "eval": {"task": "count_params", "scale": -1}}, tmp_path / "b")
    with pytest.raises(ConfigError, match="eval.limit=0 must be > 0"):
        run_eval({**raw, "eval": {"task": "count_params", "limit": 0}}, tmp_path / "b")
    with pytest.raises(ConfigError, match=re.escape("task=<" + "|".join(sorted(EVAL_TASKS)) + ">")):
        run_eval({"eval": {"task": "count_params"}, "logger": {"name": "none"}}, tmp_path / "b")
    with pytest.raises(ConfigError, match="judge=openai only applies to task=mt_bench"):
        run_eval({**raw, "judge": {"name": "openai"}}, tmp_path / "b")
    # What it needs decides whether a checkpoint is loaded (or required).
    res = run_eval({"eval": {"task": "count_params", "model": False}, "logger": {"name": "none"}}, tmp_path / "c")
    assert res["n"] == 0 and res["checkpoint"] == {"kind": None, "path": None, "step": None}
