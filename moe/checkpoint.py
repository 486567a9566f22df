"""The checkpoint file format: names, atomic save, discovery, pruning and a checked read.

A checkpoint is one file `<run_dir>/checkpoints/step_XXXXXXX.pt` holding everything a
resume needs (model, optimizer, step, data position, RNG states, the resolved config, the
tokenizer files, the W&B run id). It is written to a temp file, fsynced and renamed, so a
crash leaves either the old set or the new file, never half a file.

Distributed runs (`distributed=ddp|fsdp|ep`) write `step_XXXXXXX/` directories with
torch.distributed.checkpoint instead (read and written by `moe/distributed/checkpoint.py`);
the naming, listing and pruning here cover both kinds. This module is the lowest layer of
loading: it knows no model; `moe/loading.py` (`load_model`) sits above it and above the
distributed and HF readers.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from moe.atomic import atomic_write
from moe.errors import CheckpointError

FORMAT_VERSION = 1
_NAME = re.compile(r"^step_(\d+)(\.pt)?$")  # a file, or a distributed (DCP) checkpoint directory
DCP_META_FILE = "meta.pt"  # inside a DCP checkpoint directory: everything but the tensors


def is_dcp_checkpoint(path: Path) -> bool:
    return Path(path).is_dir() and (Path(path) / DCP_META_FILE).is_file()


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"step_{step:07d}.pt"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint files of a run, oldest first (temp files of interrupted saves are ignored)."""
    d = checkpoint_dir(run_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir()
             if (m := _NAME.match(p.name)) and (p.is_file() or is_dcp_checkpoint(p))]
    return [p for _, p in sorted(found)]


def checkpoint_step(path: Path) -> Optional[int]:
    """The step in a checkpoint's name (`step_0000040.pt` -> 40), None for other names."""
    m = _NAME.match(Path(path).name)
    return int(m.group(1)) if m else None


def latest_checkpoint(run_dir: Path) -> Optional[Path]:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def save_checkpoint(path: Path, state: dict) -> Path:
    """Write `state` atomically: temp file in the same directory, fsync, rename, fsync dir (the
    file gets ordinary permissions, see moe/atomic.py)."""
    path = Path(path)
    state = {"format_version": FORMAT_VERSION, **state}
    with atomic_write(path, "wb", fsync_dir=True) as f:
        torch.save(state, f)
        fault_pause("checkpoint-write", state.get("step"), f.name)
    return path


# Fault-injection hook for the crash tests (tests/train/test_faults.py). With
# MOE_LAB_TEST_PAUSE=<point>:<step> the process stops at that point of that step and says so on
# stderr: "checkpoint-write" (after writing the temp file, before the rename) waits to be killed;
# "step-end" (the trainer, before it checks for a stop) waits until `until()` is true, so a test
# can deliver a stop signal at an exact step instead of racing a fast training loop. Unset, it
# costs one lookup.
PAUSE_ENV = "MOE_LAB_TEST_PAUSE"


def fault_pause(point: str, step: Any, where: Any, until: Callable[[], bool] = lambda: False) -> None:
    if os.environ.get(PAUSE_ENV) == f"{point}:{step}":
        print(f"{PAUSE_ENV}: paused in {point} of step {step} ({where})", file=sys.stderr, flush=True)
        while not until():
            time.sleep(0.05)


def stale_temp_files(run_dir: Path) -> list[Path]:
    """Temp files of checkpoint saves that a crash interrupted (never listed as checkpoints)."""
    d = checkpoint_dir(run_dir)
    return sorted(p for p in d.iterdir() if p.name.endswith(".tmp") or ".tmp-" in p.name) if d.is_dir() else []


def prune_checkpoints(run_dir: Path, keep_last: int) -> None:
    for p in list_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def read_checkpoint(path: Path) -> dict:
    """Load a single-file checkpoint, turning every failure into a CheckpointError that says why
    (`moe.loading.read_any_checkpoint` also reads distributed checkpoint directories)."""
    path = Path(path)
    if is_dcp_checkpoint(path):
        raise CheckpointError(f"{str(path)!r} is a distributed checkpoint directory; read it with "
                              "moe.loading.read_any_checkpoint")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    return load_checked(path, path, ("model", "config"))


def load_checked(file: Path, checkpoint: Path, required: tuple[str, ...]) -> dict:
    """`torch.load` one file of `checkpoint` (weights only, memory-mapped), turning a corrupt file,
    missing entries or another format version into a CheckpointError that says which.

    Memory-mapped (`mmap=True`): a tensor's bytes are read from disk only when it is used, so a
    reader that takes the model's weights never reads the optimizer state (twice the model in
    fp32), and ranks reading one file share the page cache. Pages are copy-on-write: writing a
    loaded tensor never touches the file."""
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - e.g. a pre-zip (legacy) file, which cannot be mapped: read it whole
        state = None
    try:
        if state is None:
            state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"checkpoint {str(checkpoint)!r} is corrupt or truncated and cannot be read "
                              f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    missing = [k for k in required if not isinstance(state, dict) or k not in state]
    if missing:
        raise CheckpointError(f"{str(checkpoint)!r} is not a moe-lab checkpoint (no {'/'.join(missing)} "
                              f"entries in {Path(file).name})")
    if state.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {str(checkpoint)!r} has format version {state.get('format_version')}; "
                              f"this code reads version {FORMAT_VERSION}")
    return state


def page_releaser(file: Path) -> Callable[[torch.Tensor], None]:
    """`release(t)`: give back the resident pages of `t` if it lies in this process's memory map of
    `file` (what `torch.load(mmap=True)` made), so a loader that converts tensor by tensor (fp32
    stored, bf16 wanted) holds one converted copy, not the copy plus every source page it read.

    Only whole pages inside `t`, and only of a file-backed mapping of `file` (its lines in
    /proc/self/maps): there `madvise(MADV_DONTNEED)` drops pages that are re-read from the file
    if touched again, so nothing is lost (never on anonymous memory, where it would zero them).
    A no-op where /proc or libc are not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        target = os.path.realpath(file)
        ranges = []
        for line in Path("/proc/self/maps").read_text().splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and os.path.realpath(parts[5]) == target:
                start, end = (int(x, 16) for x in parts[0].split("-"))
                ranges.append((start, end))
        page = os.sysconf("SC_PAGE_SIZE")
    except (OSError, AttributeError, ValueError):
        return lambda t: None

    def release(t: torch.Tensor) -> None:
        if t.device.type != "cpu" or not t.numel():
            return
        lo = -(-t.data_ptr() // page) * page  # whole pages inside the tensor only
        hi = (t.data_ptr() + t.numel() * t.element_size()) // page * page
        if hi > lo and any(s <= lo and hi <= e for s, e in ranges):
            libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), 4)  # 4 = MADV_DONTNEED

    return release


def resolve_checkpoint(path: Any) -> Path:
    """A checkpoint file, or a run directory (its newest checkpoint)."""
    p = Path(os.path.expanduser(str(path)))
    if p.is_dir() and not is_dcp_checkpoint(p):
        ckpt = latest_checkpoint(p) or (latest_checkpoint(p.parent) if p.name == "checkpoints" else None)
        if ckpt is None:
            raise CheckpointError(f"no checkpoint found in {str(p)!r} (expected {str(checkpoint_dir(p))}/step_*.pt)")
        return ckpt
    if not p.exists():
        raise CheckpointError(f"checkpoint path {str(p)!r} does not exist")
    return p


def tokenizer_files(tokenizer) -> dict[str, str]:
    """The tokenizer's saved files as {name: text}, to embed in a checkpoint."""
    with tempfile.TemporaryDirectory() as d:
        tokenizer.save(d)
        return {p.name: p.read_text() for p in Path(d).iterdir() if p.is_file()}
