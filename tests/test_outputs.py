"""moe/outputs.py: which outputs lie in a run's `checkpoints/` (refused by every writing command: a file
there becomes what `train.resume=auto` picks), and a file output that is a directory."""

from __future__ import annotations

import pytest

from moe import outputs
from moe.errors import ConfigError


def test_a_runs_checkpoints_folder_is_recognised_by_the_run_or_its_checkpoints(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    assert not outputs.in_run_checkpoints(run / "checkpoints" / "hf")  # nothing says it is a run's yet
    (run / "metrics.jsonl").write_text("")
    for p in (run / "checkpoints", run / "checkpoints" / "hf", run / "checkpoints" / "a" / "b.pt"):
        assert outputs.in_run_checkpoints(p), p
    assert not outputs.in_run_checkpoints(run / "exports" / "hf")  # beside it is fine
    other = tmp_path / "imported" / "checkpoints"
    other.mkdir(parents=True)
    (other / "step_0000003.pt").write_bytes(b"")  # a run's checkpoints, whatever its parent holds
    assert outputs.in_run_checkpoints(other / "q.pt")
    for marker in ("config.json", "train.log"):
        r = tmp_path / f"run_{marker}"
        (r / "checkpoints").mkdir(parents=True)
        (r / marker).write_text("")
        assert outputs.in_run_checkpoints(r / "checkpoints" / "x.pt"), marker


def test_a_checkpoint_name_in_any_checkpoints_folder_is_refused_but_a_users_own_folder_is_not(tmp_path):
    mine = tmp_path / "home" / "checkpoints"  # a user's folder that happens to be called checkpoints
    mine.mkdir(parents=True)
    assert not outputs.in_run_checkpoints(mine / "int4.pt")
    assert not outputs.in_run_checkpoints(mine / "hf")
    assert outputs.in_run_checkpoints(mine / "step_0000009.pt")  # what resume=auto would pick up there
    assert outputs.in_run_checkpoints(tmp_path / "new_run" / "checkpoints" / "step_0000001")  # (a DCP folder)
    assert not outputs.in_run_checkpoints(tmp_path / "step_0000009.pt")  # not inside a checkpoints/ folder
    with pytest.raises(ConfigError, match=r"^out='.*step_0000009.pt' is inside a run's checkpoints/ directory"):
        outputs.refuse_checkpoints_dir(mine / "step_0000009.pt", "out")
    outputs.refuse_checkpoints_dir(mine / "int4.pt", "out")  # no error


def test_a_file_output_that_is_a_directory_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"^out='.*empty' is a directory; give the path of the file to write"):
        outputs.refuse_directory(tmp_path / "empty", "out")
    outputs.refuse_directory(tmp_path / "new.pt", "out")  # no error


def test_holds_is_containment_through_links(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(run)
    ckpt = run / "checkpoints" / "step_0000004.pt"
    assert outputs.holds(run, ckpt) and outputs.holds(run, run) and outputs.holds(tmp_path / "alias", ckpt)
    assert not outputs.holds(run / "checkpoints" / "x", ckpt) and not outputs.holds(tmp_path / "runs", ckpt)
    assert not outputs.holds(ckpt, run)  # the other way round
