"""Atomic writes (moe/atomic.py): all or nothing, with the permissions of any other file."""

from __future__ import annotations

import os
import stat

import pytest

from moe.atomic import atomic_write
from moe.checkpoint import read_checkpoint, save_checkpoint


def test_checkpoints_get_ordinary_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        path = save_checkpoint(tmp_path / "step_0000001.pt", {"model": {}, "config": {}, "step": 1})
        assert stat.S_IMODE(path.stat().st_mode) == 0o644  # mkstemp's 0600 hid them from the team
        assert read_checkpoint(path)["step"] == 1
    finally:
        os.umask(umask)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "results.json"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_write(target, "w") as f:
            f.write("half")
            raise RuntimeError("crash")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["results.json"]
    with atomic_write(target, "w", encoding="utf-8") as f:
        f.write("new")
    assert target.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_ordinary_permissions_follow_the_umask(tmp_path):
    from moe.atomic import current_umask, ordinary_permissions
    umask = os.umask(0o027)
    try:
        assert current_umask() == 0o027
        f = tmp_path / "weights.safetensors"
        f.write_bytes(b"x")
        os.chmod(f, 0o600)  # what safetensors leaves
        ordinary_permissions(f)
        assert stat.S_IMODE(f.stat().st_mode) == 0o640
    finally:
        os.umask(umask)
