"""`python -m eval task=lm_eval`: the harness's tasks on the loaded checkpoint through the moe_lab back-end
(results.json, per-task samples), and its bad input as one line: an unknown harness task, a task whose
dataset needs the network while offline, an unknown engine option (exit 2 through `python -m eval`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from eval.__main__ import CONFIG_DIR, run_eval
from eval.common import EvalError
from eval.preflight import preflight
from moe import cli
from moe.errors import ConfigError, UserError
from tests.eval.conftest import REPO, compose
from tests.eval.harness.conftest import LOCAL_TASKS, harness_ckpt  # noqa: F401  (harness_ckpt: a fixture)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def _config(ckpt, **eval_kw) -> dict:
    ev = {"task": "lm_eval", "include_path": [str(LOCAL_TASKS)], "include_defaults": False, **eval_kw}
    return {"ckpt": str(ckpt), "eval": ev, "logger": {"name": "none"}}


def test_results_json_holds_the_harness_results_and_samples(harness_ckpt, tmp_path):
    results = run_eval(_config(harness_ckpt, tasks=["moe_lab_mc", "moe_lab_rolling"], limit=3, batch_size=4), tmp_path)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["scores"] == results["scores"]
    assert 0.0 <= results["scores"]["moe_lab_mc/acc"] <= 1.0 and results["scores"]["moe_lab_rolling/byte_perplexity"] > 1
    assert results["n_samples"]["moe_lab_mc"]["effective"] == 3
    assert results["backend"]["stats"]["loglikelihood"]["prefix_groups"] >= 3
    rows = [json.loads(line) for line in (tmp_path / "samples_moe_lab_mc.jsonl").read_text().splitlines()]
    assert [r["doc_id"] for r in rows] == [0, 1, 2]


def test_an_unknown_harness_task_is_one_config_error(harness_ckpt, tmp_path):
    with pytest.raises(ConfigError, match=r"unknown harness task 'moe_lab_mcq' \(did you mean moe_lab_mc"):
        run_eval(_config(harness_ckpt, tasks=["moe_lab_mcq"]), tmp_path)


@pytest.mark.slow  # the harness tries the (offline) hub for ~20 s before it gives up
def test_a_task_needing_the_network_while_offline_is_one_eval_error(harness_ckpt, tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "hub_task.yaml").write_text("task: hub_task\ndataset_path: nobody/not_cached_here\noutput_type: "
                                         "multiple_choice\ntest_split: test\ndoc_to_text: '{{q}}'\n"
                                         "doc_to_choice: '{{c}}'\ndoc_to_target: 0\n")
    with pytest.raises(EvalError, match=r"not available locally .*HF_HUB_OFFLINE/HF_DATASETS_OFFLINE=1 forbids"):
        run_eval(_config(harness_ckpt, tasks=["hub_task"], include_path=[str(tasks)]), tmp_path / "run")


BAD_INPUT = [
    (["eval.tasks=[moe_lab_mc]", "+eval.engine.bogus=1"], "unknown moe_lab model_args ['bogus']"),
    (["eval.tasks=[]"], "eval.tasks is empty"),
    (["eval.tasks=[moe_lab_mc]", "+eval.engine.device=cpu"], "eval.engine.device: the model is loaded by python -m eval"),
]


@pytest.mark.parametrize("override, message", BAD_INPUT)
def test_bad_input_is_one_line_and_exit_2_as_python_m_eval_meets_it(tmp_path, capsys, override, message):
    """`python -m eval`'s steps in this process, in its order (eval/__main__.py): the override check,
    the preflight, the run on the composed config, a refusal through cli.fail; the exit status and
    stderr are what the command gives (the test below runs one of them as the real command)."""
    argv = ["task=lm_eval", "ckpt=unused", "logger=none", *override]
    with pytest.raises(SystemExit) as exited:
        cli.check_hydra_overrides(CONFIG_DIR, "eval", argv)
        preflight(CONFIG_DIR, argv)
        try:
            run_eval(compose("lm_eval", *argv[1:]), tmp_path / "run")
        except (UserError, EvalError) as e:
            cli.fail(e)
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert not (tmp_path / "run").exists(), "a refused evaluation left its run directory"


def test_bad_input_through_python_m_eval_is_one_line_and_exit_2(tmp_path):
    override, message = BAD_INPUT[0]  # the others take the same path in-process above
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "eval", "task=lm_eval", "ckpt=unused", "logger=none", *override,
                           f"hydra.run.dir={tmp_path}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
