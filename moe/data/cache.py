"""The on-disk cache of prepared data: its key, its lock, and crash-safe writes.

An entry is a directory `<cache_dir>/<key>/` holding the token shards (`train-00000.bin`, ...,
`val-00000.bin`, ...; `train.bin` / `val.bin` in entries written before shards), `tokenizer/`
and `meta.json` (which lists the shards). `meta.json` is written last (atomically), so an entry without it is
incomplete (a crash, a kill) and is rebuilt; every other file is also written to a
temporary name first and moved into place with `os.replace`, so no reader ever sees a
half-written file under its final name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator

from moe.data.lock import exclusive_lock

# Bump when the preparation code changes what it writes: every old entry becomes a miss.
CACHE_VERSION = 1

META_FILE = "meta.json"


def cache_key(settings: dict) -> str:
    """sha256 of the settings, serialised canonically (sorted keys, no whitespace)."""
    blob = json.dumps({"cache_version": CACHE_VERSION, **settings}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@contextlib.contextmanager
def entry_lock(entry_dir: Path) -> Iterator[None]:
    """Exclusive lock on one entry, so concurrent processes (e.g. two `prepare` runs) build it once.

    The others wait, then find the finished entry. The lock file sits beside the entry
    (not in it) so deleting a broken entry never deletes a held lock. `flock` where the file
    system has it, else an atomic lock file (moe/data/lock.py).
    """
    with exclusive_lock(entry_dir.parent / f"{entry_dir.name}.lock"):
        yield


def read_meta(entry_dir: Path) -> dict | None:
    """The entry's metadata, or None when the entry is missing or incomplete."""
    try:
        with open(entry_dir / META_FILE, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def reset_entry(entry_dir: Path) -> None:
    """Remove whatever an interrupted build left, and recreate the directory empty."""
    shutil.rmtree(entry_dir, ignore_errors=True)
    entry_dir.mkdir(parents=True, exist_ok=True)


def temp_path_beside(path: Path) -> Path:
    """An unused temporary file name in `path`'s directory (same file system: os.replace is atomic).

    Only a name: the caller creates the file, so it gets the usual umask permissions
    (mkstemp's 0600 would hide a shared cache from other users).
    """
    return path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
