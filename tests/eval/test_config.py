"""eval/config.py: `eval.*` merged onto the selected task's dataclass and checked by that task,
unknown keys and bad values named, dtype names from the one table (moe.dtypes), the judge group
allowed only for judged tasks, and `ckpt` required only when the task loads a model.
(The file is not called test_config.py: tests/test_config.py already has that module name.)"""

from __future__ import annotations

import re

import pytest
import torch

from eval.config import load_eval_config
from eval.tasks import EVAL_TASKS
from eval.tasks.mt_bench import MTBenchConfig
from eval.tasks.sampling_sweep import SamplingSweepConfig
from eval.tasks.truthfulqa import TruthfulQAConfig
from moe.dtypes import DTYPES
from moe.errors import ConfigError
from tests.eval.conftest import compose


def test_each_task_gets_its_own_config_dataclass():
    for task, cls in (("truthfulqa", TruthfulQAConfig), ("mt_bench", MTBenchConfig),
                      ("sampling_sweep", SamplingSweepConfig)):
        cfg = load_eval_config(compose(task, "ckpt=x", "eval.limit=7"))
        assert type(cfg.eval) is cls and cfg.task == task and cfg.eval.limit == 7 and cfg.ckpt == "x"
    cfg = load_eval_config(compose("mt_bench", "ckpt=x", "eval.temperature_config.writing=0.2"))
    assert cfg.eval.temperature_config["writing"] == 0.2 and cfg.eval.temperature_config["math"] == 0.0


@pytest.mark.parametrize("override, message", [
    ("+eval.limitt=3", "unknown config key 'eval.limitt'"),
    ("+eval.answer_file=a.jsonl", "unknown config key 'eval.answer_file'"),  # an MT-Bench key, not TruthfulQA's
    ("eval.batch_size=abc", "bad value for 'eval.batch_size'"),
    ("eval.batch_size=0", "eval.batch_size=0 must be > 0"),
    ("eval.version=2024", r"eval.version='2024' is not allowed; choose one of \['v0', '2025'\]"),
    ("eval.mc2_split=x", r"eval.mc2_split='x' is not allowed; choose one of \['first_zero', 'labels'\]"),
    ("eval.question_ids=[a]", r"eval.question_ids=\['a'\] must be a list of ints"),
    ("+judge.modell=x", "unknown config key 'judge.modell'"),
    ("+foo=1", r"unknown top-level config key\(s\) \['foo'\]"),
    ("logger.name=tensorboard", "logger.name='tensorboard' is not allowed"),
])
def test_unknown_keys_and_bad_values_are_named(override, message):
    with pytest.raises(ConfigError, match=message):
        load_eval_config(compose("truthfulqa", "ckpt=x", override))


@pytest.mark.parametrize("task, override, message", [
    ("mt_bench", "eval.temperature=-1", "eval.temperature=-1.0 must be a number >= 0"),
    ("mt_bench", "eval.max_num_seqs=0", "eval.max_num_seqs=0 must be > 0"),
    ("sampling_sweep", "eval.top_ps=[0.5,1.5]", r"eval.top_ps=\[0.5, 1.5\] must be a non-empty list"),
    ("sampling_sweep", "eval.num_samples=0", "eval.num_samples=0 must be > 0"),
])
def test_each_task_checks_its_own_fields(task, override, message):
    with pytest.raises(ConfigError, match=message):
        load_eval_config(compose(task, "ckpt=x", override))


def test_dtype_names_come_from_the_one_table():
    for name in DTYPES:
        assert load_eval_config(compose("truthfulqa", "ckpt=x", f"dtype={name}")).dtype == name
    with pytest.raises(ConfigError, match=r"dtype='fp8' is not one of \[.*'bf16'.*'fp32'.*\]"):
        load_eval_config(compose("truthfulqa", "ckpt=x", "dtype=fp8"))
    assert DTYPES["bf16"] is torch.bfloat16


def test_the_judge_applies_only_to_judged_tasks():
    cfg = load_eval_config(compose("mt_bench", "ckpt=x", "judge=openai", "judge.model=m"))
    assert cfg.judge.name == "openai" and cfg.judge.model == "m"
    with pytest.raises(ConfigError, match=r"judge=openai only applies to task=mt_bench \(got task=truthfulqa\)"):
        load_eval_config(compose("truthfulqa", "ckpt=x", "judge=openai"))
    with pytest.raises(ConfigError, match="judge.base_url='ftp://x' must be an http"):
        load_eval_config(compose("mt_bench", "ckpt=x", "judge=openai", "judge.base_url=ftp://x"))
    with pytest.raises(ConfigError, match="judge.concurrency=0 must be > 0"):
        load_eval_config(compose("mt_bench", "ckpt=x", "judge=openai", "judge.concurrency=0"))


def test_ckpt_is_required_only_when_the_task_loads_a_model():
    cfg = load_eval_config(compose("mt_bench", "eval.answer_file=answers.jsonl"))  # judging a given file
    assert cfg.ckpt is None
    for task, extra in (("mt_bench", ()), ("truthfulqa", ()), ("sampling_sweep", ("ckpt=none",)),
                        ("expert_analysis", ())):
        with pytest.raises(ConfigError, match=r"ckpt is required: python -m eval "
                                              + re.escape("task=<" + "|".join(sorted(EVAL_TASKS)) + ">")):
            load_eval_config(compose(task, *extra))


def test_eval_command_line_routing_keys():
    cfg = load_eval_config(compose("perplexity", "ckpt=x", "router.top_k=4", "router.drop_experts=[1,5]",
                                   "router.renormalize=false"))
    assert cfg.router.as_dict() == {"top_k": 4, "drop_experts": [1, 5], "renormalize": False}
    assert load_eval_config(compose("perplexity", "ckpt=x")).router.as_dict() == {}
