"""Atomic file writes with ordinary permissions, for checkpoints and results files.

`tempfile.mkstemp` creates its file with mode 0600 (owner only), and `os.replace` keeps the mode,
so files written through it stayed unreadable to the rest of a team sharing a run directory. Here
the temporary file is created like any other file (mode 0666 minus the umask, exclusively, next
to the target so the rename is atomic), then fsynced and renamed over the target.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_write(path: Path, mode: str = "wb", fsync_dir: bool = False, **open_kwargs) -> Iterator[IO]:
    """Open a temporary file beside `path` for writing; on success it replaces `path` atomically
    (fsynced first; with `fsync_dir` the directory entry too); on any error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, mode.replace("w", "x"), **open_kwargs) as f:  # x: create, never reuse a file
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync_dir:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows (/proc), else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def ordinary_permissions(*paths: Path) -> None:
    """Give files another library wrote owner-only (e.g. safetensors' 0600) the permissions of a
    file the user creates: 0666 minus the umask."""
    mode = 0o666 & ~current_umask()
    for p in paths:
        os.chmod(p, mode)
