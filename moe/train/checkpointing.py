"""The trainer's checkpoint I/O for any layout: one file on one process (`moe/checkpoint.py`),
a sharded torch.distributed.checkpoint directory on several (`moe/distributed/checkpoint.py`).
Every checkpoint holds the same entries either way, so a run resumes at any world size."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from moe.checkpoint import checkpoint_path, save_checkpoint
from moe.distributed import ParallelDims, Parallelized
from moe.distributed.checkpoint import load_train_state, read_resume_state, save_train_state
from moe.loading import read_any_checkpoint
from moe.train.optim import param_names_in_order


def read_state(path: Path, dims: ParallelDims) -> dict:
    """What this process needs to resume from `path` (a file, or a DCP directory)."""
    if not dims.enabled:
        return read_any_checkpoint(path)
    return read_resume_state(path, dims)


def load_model_optimizer(model: nn.Module, optimizer, state: dict, par: Parallelized) -> None:
    if not par.dims.enabled and "optimizer" in state:  # the single-process path
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        return
    load_train_state(model, optimizer, state, par, param_names_in_order(model))


def save(run_dir: Path, step: int, model: nn.Module, optimizer, state: dict, par: Parallelized) -> Path:
    """`state` is the single-process checkpoint dict; distributed runs save its model and
    optimizer entries with torch.distributed.checkpoint (sharded) and the rest in meta.pt."""
    if not par.dims.enabled:
        return save_checkpoint(checkpoint_path(run_dir, step), state)
    extra = {k: v for k, v in state.items() if k not in ("model", "optimizer")}
    return save_train_state(run_dir, step, model, optimizer, extra, par)
