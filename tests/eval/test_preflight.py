"""`python -m eval` refuses before it creates anything (eval/preflight.py): a bad config, a
missing checkpoint or data file, bad quantization options leave no directory behind; an output
directory holding an evaluation is refused unless eval.overwrite=true, which moves it aside."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from eval import preflight as pf
from eval.__main__ import run_eval
from eval.common import EvalError
from eval.tasks import mt_bench, perplexity, truthfulqa
from moe.errors import ConfigError
from tests.eval.conftest import REPO, compose

CONFIGS = REPO / "configs"


@pytest.fixture
def fake_ckpt(tmp_path):
    """A checkpoint path that exists but does not load: a check that passes it ran before loading."""
    p = tmp_path / "fake.pt"
    p.write_bytes(b"not a checkpoint")
    return p


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        pf.preflight(CONFIGS, argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_a_refused_eval_creates_no_directory(tmp_path, capsys, fake_ckpt):
    run_dir = tmp_path / "run"
    err = _refused(["task=truthfulqa", f"ckpt={tmp_path / 'missing'}", f"hydra.run.dir={run_dir}"], capsys)
    assert "does not exist" in err and not run_dir.exists()
    err = _refused(["task=quant_sweep", f"ckpt={fake_ckpt}", "logger=none", f"hydra.run.dir={run_dir}"], capsys)
    assert "quant.schemes lists no scheme" in err and not run_dir.exists()
    err = _refused(["task=perplexity", f"ckpt={fake_ckpt}", f"eval.data_path={tmp_path / 'no.txt'}",
                    f"hydra.run.dir={run_dir}"], capsys)
    assert "eval.data_path" in err and not run_dir.exists()


def test_the_command_leaves_no_outputs_folder(tmp_path):
    p = subprocess.run([sys.executable, "-m", "eval", "task=truthfulqa", f"ckpt={tmp_path / 'missing'}", "logger=none"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 2 and p.stderr.startswith("error: ckpt=") and len(p.stderr.splitlines()) == 1, p.stderr
    assert "does not exist" in p.stderr and "Traceback" not in p.stderr, f"not the missing checkpoint: {p.stderr}"
    assert not (tmp_path / "outputs").exists()


def test_quant_sweep_options_are_checked_before_the_checkpoint_loads(fake_ckpt, tmp_path):
    args = ["logger=none", f"ckpt={fake_ckpt}"]
    with pytest.raises(ConfigError, match=r"quant.schemes lists no scheme to compare"):
        run_eval(compose("quant_sweep", *args), tmp_path / "a")
    with pytest.raises(ConfigError, match=r"quant.calib_path=None: quant.schemes has awq"):
        run_eval(compose("quant_sweep", *args, "quant.schemes=[int8,awq]"), tmp_path / "b")
    with pytest.raises(ConfigError, match=r"quantization='int2' is unknown"):
        run_eval(compose("quant_sweep", *args, "quant.schemes=[int2]"), tmp_path / "c")
    assert not any((tmp_path / d).exists() for d in "abc")


@pytest.mark.parametrize("task, hub", [("truthfulqa", "eval.data_path=hub"), ("mt_bench", "no eval.data_path=hub"),
                                       ("perplexity", "eval.hub_name=")])
def test_missing_shared_data_names_both_ways_to_get_it(task, hub, monkeypatch, tmp_path, fake_ckpt):
    monkeypatch.setattr(truthfulqa, "SHARED_DATA", tmp_path / "nowhere")
    monkeypatch.setattr(mt_bench, "SHARED_DATA", tmp_path / "nowhere")
    monkeypatch.setattr(perplexity, "DEFAULT_TEXT", tmp_path / "nowhere" / "corpus" / "t.txt")
    with pytest.raises(EvalError) as e:
        run_eval(compose(task, f"ckpt={fake_ckpt}", "logger=none"), tmp_path / "run")
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path / "nowhere") in msg and "MOE_LAB_DATA" in msg
    assert "eval.data_path=<" in msg and hub in msg
    assert not (tmp_path / "run").exists()


def test_an_occupied_run_dir_is_refused_unless_overwrite_which_moves_it_aside(tmp_path, capsys, fake_ckpt):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "results.json").write_text("{}")
    argv = ["task=quant_sweep", f"ckpt={fake_ckpt}", "quant.schemes=[int8]", "logger=none", f"hydra.run.dir={run_dir}"]
    err = _refused(argv, capsys)
    assert str(run_dir) in err and "eval.overwrite=true" in err
    pf.preflight(CONFIGS, argv + ["eval.overwrite=true"])
    moved = list(tmp_path.glob("run.old-*"))
    assert not run_dir.exists() and len(moved) == 1 and (moved[0] / "results.json").read_text() == "{}"


@pytest.mark.parametrize("where", ["the checkpoint's run", "another training run"])
def test_a_directory_holding_checkpoints_is_never_an_evaluations_even_with_overwrite(where, tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    ckpt = run / "checkpoints" / "step_0000004.pt"
    ckpt.write_bytes(b"not a checkpoint")  # (refused before anything loads)
    (run / "metrics.jsonl").write_text("{}\n")
    if where == "another training run":
        ckpt = tmp_path / "other.pt"
        ckpt.write_bytes(b"not a checkpoint")
    for extra in ([], ["eval.overwrite=true"]):
        argv = ["task=perplexity", f"ckpt={ckpt}", "logger=none", f"hydra.run.dir={run}", *extra]
        err = _refused(argv, capsys)
        assert f"hydra.run.dir='{run}' holds " in err and "a directory of its own" in err, err
        assert ("the checkpoint being evaluated" in err) == (where == "the checkpoint's run")
        with pytest.raises(ConfigError, match=r"holds .*; an evaluation writes into a directory of its own"):
            run_eval(compose("perplexity", f"ckpt={ckpt}", "logger=none", *extra), run)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "metrics.jsonl"] and not list(tmp_path.glob("*.old-*"))
    pf.preflight(CONFIGS, ["task=perplexity", f"ckpt={ckpt}", "logger=none", f"hydra.run.dir={run / 'eval' / 'a'}"])


def test_inside_a_run_old_outputs_are_refused_or_moved_and_a_refused_run_is_discarded(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "eval.log").write_text("")
    pf.claim_run_dir(run_dir, overwrite=False)  # Hydra's own files: nothing to refuse
    (run_dir / "results.json").write_text("old")
    with pytest.raises(ConfigError, match=f"{run_dir} already holds an evaluation \\(results.json\\)"):
        pf.claim_run_dir(run_dir, overwrite=False)
    pf.claim_run_dir(run_dir, overwrite=True)
    (old,) = run_dir.glob("results.json.old-*")
    assert old.read_text() == "old" and not (run_dir / "results.json").exists()
    pf.discard_run_dir(run_dir)  # it holds a moved-aside result: kept
    assert old.exists()
    old.unlink()
    pf.discard_run_dir(run_dir)  # only what Hydra wrote: removed
    assert not run_dir.exists()
