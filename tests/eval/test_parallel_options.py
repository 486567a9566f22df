"""`python -m eval ... tensor_parallel_size=N expert_parallel=true`: declared (configs/eval.yaml) and
checked, and refused for every task before anything is created (the evaluations run the model
loaded in their own process), one line naming the field; the default of 1 runs as before."""

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


@pytest.mark.parametrize("task", sorted(EVAL_TASKS))
def test_every_task_refuses_more_than_one_rank(tmp_path, capsys, fake_ckpt, task):
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        pf.preflight(CONFIGS, [f"task={task}", f"ckpt={fake_ckpt}", "logger=none", "tensor_parallel_size=2",
                               f"hydra.run.dir={run_dir}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: tensor_parallel_size=2 is not supported by python -m eval") and task in err, err
    assert not run_dir.exists()


@pytest.mark.parametrize("fields, named", [
    (dict(expert_parallel=True), "tensor_parallel_size=1 expert_parallel=true is not supported"),
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
