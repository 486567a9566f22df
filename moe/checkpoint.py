"""Checkpoints: atomic save, newest-first discovery, strict loading, and `load_model`.

A checkpoint is one file `<run_dir>/checkpoints/step_XXXXXXX.pt` holding everything a
resume needs (model, optimizer, step, data position, RNG states, the resolved config, the
tokenizer files, the W&B run id). It is written to a temp file, fsynced and renamed, so a
crash leaves either the old set or the new file, never half a file.

Distributed runs (`distributed=ddp|fsdp|ep`) write `step_XXXXXXX/` directories with
torch.distributed.checkpoint instead (`moe/distributed/checkpoint.py`); everything here
(listing, pruning, `read_checkpoint`, `load_model`) accepts both kinds.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch

FORMAT_VERSION = 1
_NAME = re.compile(r"^step_(\d+)(\.pt)?$")  # a file, or a distributed (DCP) checkpoint directory
DCP_META_FILE = "meta.pt"  # inside a DCP checkpoint directory: everything but the tensors


def is_dcp_checkpoint(path: Path) -> bool:
    return Path(path).is_dir() and (Path(path) / DCP_META_FILE).is_file()


class CheckpointError(RuntimeError):
    """A missing, corrupt or incompatible checkpoint."""


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


def latest_checkpoint(run_dir: Path) -> Optional[Path]:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def save_checkpoint(path: Path, state: dict) -> Path:
    """Write `state` atomically: temp file in the same directory, fsync, rename, fsync dir."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"format_version": FORMAT_VERSION, **state}
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def prune_checkpoints(run_dir: Path, keep_last: int) -> None:
    for p in list_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def read_checkpoint(path: Path) -> dict:
    """Load a checkpoint file, turning every failure into a CheckpointError that says why."""
    path = Path(path)
    if is_dcp_checkpoint(path):
        from moe.distributed.checkpoint import read_dcp_checkpoint
        return read_dcp_checkpoint(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    return load_checked(path, path, ("model", "config"))


def load_checked(file: Path, checkpoint: Path, required: tuple[str, ...]) -> dict:
    """`torch.load` one file of `checkpoint` (weights only), turning a corrupt file, missing
    entries or another format version into a CheckpointError that says which."""
    try:
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


def config_differences(saved: dict, current: dict, sections=("model", "router", "experts")) -> list[str]:
    """Fields whose values differ between two config dicts, as 'section.key: saved -> current'."""
    diffs = []
    for sec in sections:
        a, b = saved.get(sec, {}), current.get(sec, {})
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                diffs.append(f"{sec}.{k}: checkpoint has {a.get(k)!r}, config has {b.get(k)!r}")
    return diffs


def tokenizer_files(tokenizer) -> dict[str, str]:
    """The tokenizer's saved files as {name: text}, to embed in a checkpoint."""
    with tempfile.TemporaryDirectory() as d:
        tokenizer.save(d)
        return {p.name: p.read_text() for p in Path(d).iterdir() if p.is_file()}


def tokenizer_from_files(files: dict[str, str]):
    from moe.data import Tokenizer

    with tempfile.TemporaryDirectory() as d:
        for name, text in files.items():
            (Path(d) / name).write_text(text)
        return Tokenizer.load(d)


def load_model(path: Any, device: Any = "cpu", dtype: Optional[torch.dtype] = None, eval_mode: bool = True):
    """Load `(model, tokenizer, cfg)` from a checkpoint file or a run directory.

    The model is rebuilt from the checkpoint's own resolved config, so it needs nothing
    from the current Hydra setup. `dtype` casts the weights (e.g. torch.bfloat16).
    """
    from moe.hf_io import is_hf_dir, load_hf_dir  # local: moe.hf_io imports this module
    if is_hf_dir(path):  # a Mixtral-architecture HF directory (our export or a foreign one)
        return load_hf_dir(path, device=device, dtype=dtype, eval_mode=eval_mode)
    from moe.config import from_dict
    from moe.model import Transformer

    state = read_checkpoint(resolve_checkpoint(path))
    cfg = from_dict(state["config"])
    model = Transformer(cfg.model, cfg.router, cfg.attention.name, cfg.experts.name)
    try:
        model.load_state_dict(state["model"], strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint weights do not fit the model its config describes: {e}") from None
    model.to(device=device, dtype=dtype)
    if eval_mode:
        model.eval()
    tokenizer = tokenizer_from_files(state["tokenizer"]) if state.get("tokenizer") else None
    return model, tokenizer, cfg

