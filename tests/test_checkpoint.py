"""`moe/checkpoint.py`, the checkpoint file format on its own (no training): names, listing and
pruning of both kinds (files and distributed directories), the checked read and its errors,
resolving a path, stale temp files, the fault-injection pause."""

from __future__ import annotations

import os
import pickle
import stat
import zipfile
from pathlib import Path

import pytest
import torch

import moe.checkpoint as ckpt
from moe.checkpoint import (DCP_META_FILE, FORMAT_VERSION, PAUSE_ENV, checkpoint_dir, checkpoint_path,
                            checkpoint_step, fault_pause, is_dcp_checkpoint, latest_checkpoint, list_checkpoints,
                            load_checked, prune_checkpoints, read_checkpoint, resolve_checkpoint, save_checkpoint,
                            stale_temp_files)
from moe.errors import CheckpointError

STATE = {"model": {"w": torch.arange(3.0)}, "config": {"x": 1}, "step": 7}


def dcp_dir(run, step):
    d = checkpoint_dir(run) / f"step_{step:07d}"
    d.mkdir(parents=True)
    (d / DCP_META_FILE).write_bytes(b"")
    return d


def test_names_and_steps(tmp_path):
    assert checkpoint_path(tmp_path, 40) == tmp_path / "checkpoints" / "step_0000040.pt"
    assert checkpoint_step("step_0000040.pt") == 40 and checkpoint_step(tmp_path / "step_0000012") == 12
    for other in ("step_12.pth", "last.pt", "step_.pt", ".step_0000040.pt.123-ab.tmp", "xstep_0000001.pt"):
        assert checkpoint_step(other) is None, other


def test_listing_orders_by_step_and_skips_temp_files_and_plain_directories(tmp_path):
    assert list_checkpoints(tmp_path) == [] and latest_checkpoint(tmp_path) is None
    for step in (100, 20, 3):
        save_checkpoint(checkpoint_path(tmp_path, step), STATE)
    d = dcp_dir(tmp_path, 50)
    (checkpoint_dir(tmp_path) / "step_0000060").mkdir()  # a directory without meta.pt: not a checkpoint
    (checkpoint_dir(tmp_path) / ".step_0000070.pt.1-ab.tmp").write_bytes(b"x")  # an interrupted file save
    (checkpoint_dir(tmp_path) / ".step_0000080.tmp-1a2b3c4d").mkdir()  # an interrupted DCP save (a directory)
    (checkpoint_dir(tmp_path) / "notes.txt").write_text("x")
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names == ["step_0000003.pt", "step_0000020.pt", "step_0000050", "step_0000100.pt"]
    assert latest_checkpoint(tmp_path).name == "step_0000100.pt" and is_dcp_checkpoint(d)
    assert not is_dcp_checkpoint(checkpoint_dir(tmp_path) / "step_0000060")
    assert not is_dcp_checkpoint(checkpoint_path(tmp_path, 3))  # a file is never a DCP directory
    assert [p.name for p in stale_temp_files(tmp_path)] == [".step_0000070.pt.1-ab.tmp", ".step_0000080.tmp-1a2b3c4d"]
    assert stale_temp_files(tmp_path / "nothing") == []


def test_prune_keeps_the_newest_of_both_kinds(tmp_path):
    for step in (1, 2, 4):
        save_checkpoint(checkpoint_path(tmp_path, step), STATE)
    dcp_dir(tmp_path, 3)
    prune_checkpoints(tmp_path, 2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000003", "step_0000004.pt"]
    prune_checkpoints(tmp_path, 1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000004.pt"]
    assert sorted(p.name for p in checkpoint_dir(tmp_path).iterdir()) == ["step_0000004.pt"]  # the directory is gone


def test_a_checkpoint_file_removed_by_someone_else_does_not_stop_pruning(tmp_path, monkeypatch):
    """A file listed for pruning can be gone by the time it is unlinked (another process pruning
    the same run directory, a person tidying up): pruning goes on."""
    for step in (1, 2, 3):
        save_checkpoint(checkpoint_path(tmp_path, step), STATE)
    listed = list_checkpoints(tmp_path)
    checkpoint_path(tmp_path, 1).unlink()  # after the listing, before the prune
    monkeypatch.setattr(ckpt, "list_checkpoints", lambda run_dir: listed)
    prune_checkpoints(tmp_path, 1)
    monkeypatch.undo()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000003.pt"]


def test_save_fsyncs_the_file_and_then_its_directory(tmp_path, monkeypatch):
    """A checkpoint survives a power loss once saved: the data is fsynced before the rename, and
    the directory after it (the new name is durable too)."""
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(stat.S_ISDIR(os.fstat(fd).st_mode)), real_fsync(fd)))
    save_checkpoint(checkpoint_path(tmp_path, 1), STATE)
    assert synced == [False, True]


def test_a_checkpoint_directory_that_cannot_be_removed_does_not_stop_pruning(tmp_path, monkeypatch):
    """Pruning runs inside the training loop: an old DCP directory with a file that cannot be
    deleted (permissions, a network file system) is left behind, the run and the rest of the
    pruning go on."""
    d = dcp_dir(tmp_path, 1)
    for step in (2, 3):
        save_checkpoint(checkpoint_path(tmp_path, step), STATE)
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if Path(path).name == DCP_META_FILE:
            raise PermissionError(13, "Permission denied", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    prune_checkpoints(tmp_path, 1)
    monkeypatch.undo()
    assert [p.name for p in list_checkpoints(tmp_path)] == [d.name, "step_0000003.pt"]  # step 2 pruned
    assert (d / DCP_META_FILE).is_file()


def test_save_adds_the_format_version_and_read_returns_everything(tmp_path):
    path = save_checkpoint(checkpoint_path(tmp_path, 7), STATE)
    state = read_checkpoint(path)
    assert state["format_version"] == FORMAT_VERSION and state["step"] == 7 and state["config"] == {"x": 1}
    assert torch.equal(state["model"]["w"], torch.arange(3.0))
    assert not stale_temp_files(tmp_path)


def test_read_errors_say_what_is_wrong(tmp_path):
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(tmp_path / "none.pt")
    assert str(e.value) == f"checkpoint {str(tmp_path / 'none.pt')!r} does not exist"
    d = dcp_dir(tmp_path, 5)
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(d)
    assert str(e.value) == (f"{str(d)!r} is a distributed checkpoint directory; read it with "
                            "moe.loading.read_any_checkpoint")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match=rf"^checkpoint '{bad}' is corrupt or truncated and cannot be read "
                                              r"\(UnpicklingError: "):
        read_checkpoint(bad)
    no_config = tmp_path / "no_config.pt"
    torch.save({"model": {}}, no_config)
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(no_config)
    assert str(e.value) == f"{str(no_config)!r} is not a moe-lab checkpoint (no config entries in no_config.pt)"
    neither = tmp_path / "neither.pt"
    torch.save([1, 2], neither)
    with pytest.raises(CheckpointError, match=r"\(no model/config entries in neither.pt\)$"):
        read_checkpoint(neither)
    old = tmp_path / "old.pt"
    torch.save({**STATE, "format_version": 0}, old)
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(old)
    assert str(e.value) == f"checkpoint {str(old)!r} has format version 0; this code reads version {FORMAT_VERSION}"


def test_a_truncated_file_is_named_as_such(tmp_path):
    path = save_checkpoint(tmp_path / "c.pt", STATE)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="is corrupt or truncated and cannot be read"):
        read_checkpoint(path)


def test_a_legacy_non_zip_file_is_read_whole(tmp_path):
    """torch.save's pre-zip format cannot be memory-mapped; load_checked falls back to a plain read."""
    path = tmp_path / "legacy.pt"
    torch.save({**STATE, "format_version": FORMAT_VERSION}, path, _use_new_zipfile_serialization=False)
    assert not zipfile.is_zipfile(path)
    state = load_checked(path, path, ("model", "config"))
    assert torch.equal(state["model"]["w"], torch.arange(3.0))


def test_weights_only_refuses_arbitrary_objects(tmp_path):
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        pickle.dump({"model": {}, "config": {}, "format_version": 1, "x": print}, f, protocol=2)
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        read_checkpoint(path)
    # the same in torch's zip format, which the memory-mapped read takes (not its legacy fallback)
    torch.save({"model": {}, "config": {}, "format_version": 1, "x": print}, tmp_path / "evil_zip.pt")
    assert zipfile.is_zipfile(tmp_path / "evil_zip.pt")
    with pytest.raises(CheckpointError, match=r"corrupt or truncated .*\(UnpicklingError: Weights only load failed"):
        read_checkpoint(tmp_path / "evil_zip.pt")
    # and in torch's legacy (pre-zip) format, which is read whole, also weights-only
    with open(tmp_path / "evil_legacy.pt", "wb") as f:
        torch.save({"model": {}, "config": {}, "format_version": 1, "x": print}, f, _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match=r"\(UnpicklingError: Weights only load failed"):
        read_checkpoint(tmp_path / "evil_legacy.pt")


def test_a_read_error_quotes_the_first_line_of_the_cause_cut_at_200_characters(tmp_path, monkeypatch):
    save_checkpoint(tmp_path / "c.pt", STATE)

    def fail(*args, **kwargs):
        raise RuntimeError("y" * 300 + "\nsecond line")

    monkeypatch.setattr(torch, "load", fail)
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(tmp_path / "c.pt")
    assert str(e.value) == (f"checkpoint {str(tmp_path / 'c.pt')!r} is corrupt or truncated and cannot be read "
                            f"(RuntimeError: {'y' * 200})")


def test_resolve_a_file_a_run_directory_or_its_checkpoints_directory(tmp_path):
    for step in (1, 2):
        save_checkpoint(checkpoint_path(tmp_path / "run", step), STATE)
    newest = checkpoint_path(tmp_path / "run", 2)
    assert resolve_checkpoint(tmp_path / "run") == newest
    assert resolve_checkpoint(checkpoint_dir(tmp_path / "run")) == newest
    assert resolve_checkpoint(checkpoint_path(tmp_path / "run", 1)) == checkpoint_path(tmp_path / "run", 1)
    d = dcp_dir(tmp_path / "run2", 3)
    assert resolve_checkpoint(d) == d  # a DCP directory is a checkpoint, not a run
    assert resolve_checkpoint(tmp_path / "run2") == d
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError) as e:
        resolve_checkpoint(tmp_path / "empty")
    assert str(e.value) == (f"no checkpoint found in {str(tmp_path / 'empty')!r} "
                            f"(expected {str(tmp_path / 'empty' / 'checkpoints')}/step_*.pt)")
    # only a directory named `checkpoints` falls back to its parent run: another sub-directory of
    # a run (its hydra/ or wandb/ folder) holds no checkpoint and says so
    (tmp_path / "run" / "hydra").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint found in"):
        resolve_checkpoint(tmp_path / "run" / "hydra")
    with pytest.raises(CheckpointError) as e:
        resolve_checkpoint(tmp_path / "missing.pt")
    assert str(e.value) == f"checkpoint path {str(tmp_path / 'missing.pt')!r} does not exist"


def test_fault_pause_stops_only_at_its_point_and_step(monkeypatch, capsys):
    """The crash tests' hook: with MOE_LAB_TEST_PAUSE=<point>:<step> the process says where it is
    (on stderr, word for word: the crash tests wait for that line) and waits; any other point or
    step passes straight through."""
    monkeypatch.setenv(PAUSE_ENV, "step-end:4")
    fault_pause("checkpoint-write", 4, "x")
    fault_pause("step-end", 5, "y")
    calls = [0]
    fault_pause("step-end", 4, "z", until=lambda: calls.__setitem__(0, calls[0] + 1) or calls[0] > 2)
    assert calls[0] == 3
    out = capsys.readouterr()
    assert out.out == "" and out.err == f"{PAUSE_ENV}: paused in step-end of step 4 (z)\n"


def test_save_pauses_with_the_temp_file_written_and_not_yet_renamed(tmp_path, monkeypatch):
    """`checkpoint-write:<step>` stops a save in its crash window: the temp file holds the whole
    checkpoint, the final name does not exist yet (what the kill-during-save test relies on)."""
    seen = []

    def pause(point, step, where):
        seen.append((point, step, Path(where).parent, read_checkpoint(Path(where))["step"],
                     checkpoint_path(tmp_path, 6).exists()))

    monkeypatch.setattr(ckpt, "fault_pause", pause)
    save_checkpoint(checkpoint_path(tmp_path, 6), {**STATE, "step": 6})
    assert seen == [("checkpoint-write", 6, checkpoint_dir(tmp_path), 6, False)]
