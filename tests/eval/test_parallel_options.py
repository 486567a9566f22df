"""`python -m eval ... tensor_parallel_size=N expert_parallel=true`: declared (configs/eval.yaml) and
checked before anything is created. The tasks that generate only through their engine (mt_bench,
structured) take it (tests/eval/test_parallel_generation.py runs them); every other task runs the
model loaded in its own process and is refused, one line naming the task and the field, as is a
layout the checkpoint cannot split or quantization with T > 1; the default of 1 runs as before."""

from __future__ import annotations

import pytest

from eval import preflight as pf
from eval.config import load_eval_config
from eval.tasks import EVAL_TASKS
from moe.errors import ConfigError
from tests.eval.conftest import REPO

CONFIGS = REPO / "configs"


@pytest.fixture
def fake_ckpt(tmp_path):
    p = tmp_path / "fake.pt"
    p.write_bytes(b"not a checkpoint")  # never opened: the refusal comes first
    return p


PARALLEL_TASKS = ["mt_bench", "structured"]


def test_which_tasks_take_several_ranks():
    assert sorted(t for t in EVAL_TASKS if EVAL_TASKS.lookup(t).parallel_engine) == PARALLEL_TASKS


def _refused(tmp_path, capsys, *args) -> str:
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        pf.preflight(CONFIGS, [*args, "logger=none", f"hydra.run.dir={run_dir}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert not run_dir.exists()
    return err


@pytest.mark.parametrize("task", sorted(set(EVAL_TASKS) - set(PARALLEL_TASKS)))
def test_in_process_tasks_refuse_more_than_one_rank(tmp_path, capsys, fake_ckpt, task):
    err = _refused(tmp_path, capsys, f"task={task}", f"ckpt={fake_ckpt}", "tensor_parallel_size=2")
    assert err.startswith(f"error: tensor_parallel_size=2 is not supported by task={task}: it runs the model "
                          "loaded in this process"), err
    assert "task=mt_bench|structured" in err, err


@pytest.mark.parametrize("task", PARALLEL_TASKS)
def test_generation_tasks_refuse_quantization_with_several_ranks(tmp_path, capsys, fake_ckpt, task):
    err = _refused(tmp_path, capsys, f"task={task}", f"ckpt={fake_ckpt}", "tensor_parallel_size=2", "quant=int8")
    assert err.startswith("error: quant=int8 is not supported with tensor_parallel_size=2"), err


@pytest.mark.parametrize("task", PARALLEL_TASKS)
@pytest.mark.parametrize("layout, named", [
    (["tensor_parallel_size=3"], "model.n_heads=4 is not divisible by tensor_parallel_size=3"),
    (["tensor_parallel_size=4", "expert_parallel=true"], "model.n_kv_heads=2 is not divisible by tensor_parallel_size=4"),
])
def test_a_layout_the_checkpoint_cannot_split_is_refused_before_the_run(tmp_path, capsys, tiny_run, task, layout,
                                                                       named):
    err = _refused(tmp_path, capsys, f"task={task}", f"ckpt={tiny_run}", *layout)
    assert err.startswith(f"error: {named}"), err


@pytest.mark.parametrize("fields, named", [
    (dict(expert_parallel=True), "expert_parallel=true needs tensor_parallel_size > 1"),
    (dict(tensor_parallel_size=2), "tensor_parallel_size=2 is not supported by task=perplexity"),
    (dict(tensor_parallel_size=0), "tensor_parallel_size=0 must be an integer >= 1"),
    (dict(tensor_parallel_size="two"), "tensor_parallel_size='two' must be an integer >= 1"),
    (dict(expert_parallel="yes"), "expert_parallel='yes' must be true or false"),
])
def test_bad_values_and_expert_parallel_alone(fields, named):
    with pytest.raises(ConfigError, match=named):
        load_eval_config({"ckpt": "x.pt", "eval": {"task": "perplexity"}, **fields})


def test_the_default_is_one_rank():
    cfg = load_eval_config({"ckpt": "x.pt", "eval": {"task": "perplexity"}})
    assert cfg.tensor_parallel_size == 1 and cfg.expert_parallel is False
