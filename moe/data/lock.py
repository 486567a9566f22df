"""An exclusive inter-process lock on a path, that also works where `flock` does not.

`fcntl.flock` is the first choice: the kernel releases it when its holder dies, so a killed
build never blocks the next one. Some parallel file systems (Lustre mounted without
`-o flock`, some NFS setups) refuse it with ENOSYS / EOPNOTSUPP / ENOLCK. There the lock falls
back to a lock file created atomically (`O_CREAT | O_EXCL`) holding the owner's host, pid and
start time. Written here rather than taken from `filelock` (a dependency of `datasets`): the
versions our dependencies allow (filelock >= 3.10) have no fallback at all, and the recent ones
that do (4.x) fall back on ENOSYS only and never judge a lock file of another host stale, so on
a shared file system without flock, one killed build on one node would block every later build
on every node until someone deleted the file by hand.

Stale detection: an owner on this host is checked directly (is its pid alive?); an owner on
another host cannot be, so its file is trusted while the owner refreshes its modification time
(a heartbeat thread, every `heartbeat_s`), and taken over once it is older than `stale_s`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # not on Windows: the lock file alone
    fcntl = None

logger = logging.getLogger(__name__)

# What flock raises on a file system that does not support it.
FLOCK_UNSUPPORTED = (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL)
HEARTBEAT_S = 30.0
STALE_S = 600.0  # an owner on another host that has not refreshed its file for this long is gone
POLL_S = 0.5


@contextlib.contextmanager
def exclusive_lock(path: Path, stale_s: float = STALE_S, heartbeat_s: float = HEARTBEAT_S) -> Iterator[None]:
    """Hold an exclusive lock named `path` (created if missing) for the `with` body."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fcntl is not None:
        with open(path, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX)
            except OSError as e:
                if e.errno not in FLOCK_UNSUPPORTED:
                    raise
                logger.info("data: flock is not supported on %s (%s); using a lock file", path.parent, e)
            else:
                try:
                    yield
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)
                return
    with lock_file(path.with_name(path.name + ".owner"), stale_s, heartbeat_s):
        yield


def _owner_record() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def is_stale(path: Path, stale_s: float) -> bool:
    """Whether the lock file at `path` belongs to an owner that is gone."""
    try:
        owner = json.loads(path.read_text())
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return False  # released meanwhile: not stale, just free
    except (OSError, ValueError):
        # Unreadable or half-written (its owner died between create and write): judge by age alone.
        try:
            return time.time() - path.stat().st_mtime > stale_s
        except FileNotFoundError:
            return False
    if owner.get("host") == socket.gethostname():
        return not _pid_alive(int(owner.get("pid", -1)))
    return age > stale_s


@contextlib.contextmanager
def lock_file(path: Path, stale_s: float = STALE_S, heartbeat_s: float = HEARTBEAT_S) -> Iterator[None]:
    """The O_CREAT|O_EXCL lock: wait until the file can be created, removing a stale one."""
    path = Path(path)
    waited = False
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if is_stale(path, stale_s):
                logger.warning("data: removing the stale lock %s (%s)", path, _describe(path))
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                continue
            if not waited:
                logger.info("data: waiting for the lock %s (%s)", path, _describe(path))
                waited = True
            time.sleep(POLL_S)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(_owner_record(), f)
        break
    stop = threading.Event()

    def heartbeat():  # keep the file fresh for waiters on other hosts
        while not stop.wait(heartbeat_s):
            with contextlib.suppress(OSError):
                os.utime(path)

    beat = threading.Thread(target=heartbeat, name="moe-data-lock-heartbeat", daemon=True)
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _describe(path: Path) -> str:
    try:
        return path.read_text().strip() or "empty"
    except OSError:
        return "unreadable"
