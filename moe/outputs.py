"""What every command that writes a result follows: it never overwrites a file it did not create
in this run.

    check_free(out, "--overwrite", overwrite)      # early, before anything is loaded
    ... the work ...
    move_aside(out)                                 # with --overwrite, right before writing

An existing output (a file, or a directory that is not empty) is an error naming the path and
the flag, unless the flag is given; then the old output is renamed to `<name>.old-<time>` beside
it, never deleted. Writing into a run's `checkpoints/` directory is refused outright: a file
there is what `train.resume=auto` and `ckpt=<run dir>` pick up as the run's newest checkpoint.
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from moe.errors import ConfigError

log = logging.getLogger("moe")

CHECKPOINTS_DIR = "checkpoints"  # moe.checkpoint.checkpoint_dir's folder of a run


def as_path(path: Any) -> Path:
    return Path(os.path.expanduser(str(path)))


def occupied(path: Path) -> bool:
    """Whether `path` holds something to lose: a file, or a directory with anything in it."""
    path = Path(path)
    if path.is_dir():
        return any(path.iterdir())
    return path.exists() or path.is_symlink()


def check_free(path: Any, flag: str, overwrite: bool) -> None:
    """A ConfigError naming `path` and `flag` when `path` is occupied and `overwrite` is false."""
    path = as_path(path)
    if occupied(path) and not overwrite:
        raise ConfigError(f"{path} already exists; write somewhere else, or add {flag} to move it aside "
                          f"(to {path.name}.old-<time>; nothing is deleted)")


def aside_path(path: Path) -> Path:
    """`<path>.old-<time>`, with a counter when that exists too."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest = path.with_name(f"{path.name}.old-{stamp}")
    n = 1
    while dest.exists() or dest.is_symlink():
        n += 1
        dest = path.with_name(f"{path.name}.old-{stamp}-{n}")
    return dest


def move_aside(path: Any) -> Path | None:
    """Rename an occupied `path` to `<path>.old-<time>` and return where it went (None: nothing
    there). An empty directory is left in place: there is nothing in it to keep."""
    path = as_path(path)
    if not occupied(path):
        return None
    dest = aside_path(path)
    path.rename(dest)
    log.warning("moved the existing %s aside to %s", path, dest)
    return dest


RUN_FILES = ("metrics.jsonl", "config.json", "train.log")  # what a run directory holds beside its checkpoints/
STEP_NAME = re.compile(r"step_\d+(\.pt)?$")  # a run's checkpoint name (moe.checkpoint's), file or DCP folder


def in_run_checkpoints(path: Any) -> bool:
    """Whether `path` is, or lies in, a run's `checkpoints/` directory: a folder of that name whose parent
    holds a run's files (`RUN_FILES`) or that already holds `step_*` checkpoints, or any `checkpoints/`
    when `path` is named like a run's checkpoint (what `train.resume=auto` would pick up). A user's own
    folder that happens to be called `checkpoints` is not a run's."""
    path = as_path(path).absolute()
    for folder in (path, *path.parents):
        if folder.name != CHECKPOINTS_DIR:
            continue
        if STEP_NAME.match(path.name) and folder != path:
            return True
        if any((folder.parent / f).exists() for f in RUN_FILES):
            return True
        if folder.is_dir() and any(STEP_NAME.match(p.name) for p in folder.iterdir()):
            return True
    return False


def refuse_checkpoints_dir(path: Any, flag: str) -> None:
    """A ConfigError when `path` is or lies inside a run's `checkpoints/` directory (`in_run_checkpoints`)."""
    if in_run_checkpoints(path):
        raise ConfigError(f"{flag}={str(as_path(path).absolute())!r} is inside a run's {CHECKPOINTS_DIR}/ directory, "
                          "where it would become the checkpoint that train.resume=auto and ckpt=<run dir> pick; "
                          "write it elsewhere")


def refuse_directory(path: Any, flag: str) -> None:
    """A ConfigError when the output file `path` is an existing directory (an empty one passes
    `check_free`, and writing the file there would fail after the slow work)."""
    if as_path(path).is_dir():
        raise ConfigError(f"{flag}={str(path)!r} is a directory; give the path of the file to write "
                          f"(e.g. {str(as_path(path) / 'model.pt')!r})")


def holds(folder: Any, path: Any) -> bool:
    """Whether `path` is `folder` or lies inside it (links resolved: another name for the same place counts)."""
    folder, path = as_path(folder).resolve(), as_path(path).resolve()
    return path == folder or folder in path.parents


def refuse_own_input(source: Any, out: Any, flag: str) -> None:
    """A ConfigError when the output `out` is the input `source` (or holds it): the input would be lost."""
    if holds(out, source):
        raise ConfigError(f"{flag}={str(out)!r} is the input {str(source)!r}; the output must be a new path")
