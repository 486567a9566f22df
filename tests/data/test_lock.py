"""The data cache's lock: exclusive with flock, and exclusive without it (ENOSYS, as on Lustre
mounted without flock) through the O_EXCL lock file, which a dead owner does not block."""

import errno
import json
import os
import socket
import threading
import time

import pytest

from moe.config import DataConfig
from moe.data import lock as lock_mod
from moe.data import prepare_data
from moe.data.lock import exclusive_lock, is_stale


def _no_flock(monkeypatch):
    def flock(*args):
        raise OSError(errno.ENOSYS, "Function not implemented")
    monkeypatch.setattr(lock_mod.fcntl, "flock", flock)


def _overlaps(path, n_threads=4):
    """Run n threads that each hold the lock for a moment; return whether two held it at once."""
    inside, overlap = [0], [False]
    guard = threading.Lock()

    def work():
        with exclusive_lock(path):
            with guard:
                inside[0] += 1
                overlap[0] |= inside[0] > 1
            time.sleep(0.05)
            with guard:
                inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return overlap[0]


@pytest.mark.parametrize("flock", ["works", "enosys"])
def test_lock_is_exclusive(tmp_path, monkeypatch, flock):
    monkeypatch.setattr(lock_mod, "POLL_S", 0.01)
    if flock == "enosys":
        _no_flock(monkeypatch)
    assert not _overlaps(tmp_path / "entry.lock")
    assert not (tmp_path / "entry.lock.owner").exists()  # the lock file is gone after release


def test_other_flock_errors_are_not_swallowed(tmp_path, monkeypatch):
    def flock(*args):
        raise OSError(errno.EIO, "I/O error")
    monkeypatch.setattr(lock_mod.fcntl, "flock", flock)
    with pytest.raises(OSError, match="I/O error"):
        with exclusive_lock(tmp_path / "x.lock"):
            pass


def test_stale_lock_files_are_taken_over(tmp_path, monkeypatch):
    owner = tmp_path / "e.lock.owner"
    here = socket.gethostname()
    dead = os.fork()  # a pid that surely is not running any more
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    owner.write_text(json.dumps({"host": here, "pid": dead, "started": 0}))
    assert is_stale(owner, stale_s=600)
    owner.write_text(json.dumps({"host": here, "pid": os.getpid(), "started": 0}))
    assert not is_stale(owner, stale_s=600)  # alive on this host
    owner.write_text(json.dumps({"host": "another-node", "pid": 1, "started": 0}))
    assert not is_stale(owner, stale_s=600)  # elsewhere and fresh: trusted
    old = time.time() - 3600
    os.utime(owner, (old, old))
    assert is_stale(owner, stale_s=600)  # elsewhere, no heartbeat for an hour: gone

    _no_flock(monkeypatch)
    owner.write_text(json.dumps({"host": here, "pid": dead, "started": 0}))
    with exclusive_lock(tmp_path / "e.lock"):  # a dead owner's file does not block
        assert json.loads(owner.read_text())["pid"] == os.getpid()
    assert not owner.exists()


def test_prepare_data_without_flock(corpus, tmp_path, monkeypatch):
    _no_flock(monkeypatch)
    cfg = DataConfig(name="text", path=str(corpus / "tinyshakespeare.txt"), vocab_size=320, max_chars=20_000,
                     num_proc=1)
    first = prepare_data(cfg, cache_root=str(tmp_path))
    assert not first.cache_hit and prepare_data(cfg, cache_root=str(tmp_path)).cache_hit
    assert not list(tmp_path.glob("*.owner"))
