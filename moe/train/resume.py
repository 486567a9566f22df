"""What a resumed run restores and checks: RNG states, the checkpoint's entries, the whole config.

A resume continues the *same* run, so the config must be the checkpoint's. Only fields that
change neither what is trained nor the logged values may differ freely (`RESUME_EXEMPT`):
when to stop, log, evaluate and checkpoint, the logger, the run-control switches, and where the
run executes (device, compile, distributed layout: a checkpoint resumes at any world size). Any
other difference is an error naming the fields, unless `train.resume_allow` lists it; allowed
changes are logged, with the learning rate at the resumed step before and after when they
change the schedule (`optim.*`, `train.max_steps`).
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from moe.config import Config, canonical_field, to_dict
from moe.errors import CheckpointError, ConfigError
from moe.dtypes import dtype_name
from moe.perf import resolve_device, run_dtype
from moe.train.optim import lr_at

log = logging.getLogger("moe")

# Fields a resume may change without train.resume_allow (a name, or a section ending in ".").
RESUME_EXEMPT = (
    # when to stop / log / evaluate / checkpoint, and the logger: not what is trained
    "train.stop_after", "train.log_interval", "train.eval_interval", "train.ckpt_interval", "train.keep_last",
    "logger.",
    # the run-control switches themselves
    "train.resume", "train.resume_allow", "train.overwrite", "train.exit_zero_on_signal", "train.stop_on_nan",
    # where the run executes: checkpoints resume at any world size and layout (docs/guides/distributed.md)
    "train.device", "train.tf32", "train.compile", "train.peak_flops", "distributed.name", "distributed.backend",
    "distributed.ep_size", "distributed.fsdp", "distributed.mixed_precision", "distributed.reshard_after_forward",
    "distributed.timeout_s", "distributed.ep_grad_bucket_mb", "data.cache_dir", "data.num_proc",
    # memory/speed trade-offs that compute the same numbers
    "train.activation_checkpointing", "data.shard_tokens",
)
TRAINING_ENTRIES = ("step", "data", "rng", "log_window", "config")
# Where the weights and the optimizer state are: a single file holds them; a distributed (DCP)
# checkpoint holds them by name, or in its shards (`dcp_path`, loaded in place).
WEIGHTS, OPTIMIZER = ("model", "dcp_path"), ("optimizer", "optimizer_by_name", "dcp_path")


class Change(NamedTuple):
    field: str
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.field}: checkpoint has {self.old!r}, config has {self.new!r}"


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def matches_field(name: str, patterns) -> bool:
    return any(name == p or (p.endswith(".") and name.startswith(p)) or name.startswith(p + ".") for p in patterns)


def _run_dtype_name(cfg: Config) -> Any:
    """`train.dtype` as the run resolves it on its device: `auto` and `fp32` are the same run on a
    CPU (runs from before `auto` became the default saved `fp32`), and `auto` on a CPU then on a
    GPU is a change (fp32 -> bf16). The raw value where the device cannot be resolved here."""
    try:
        return dtype_name(run_dtype(resolve_device(cfg.train.device), cfg.train.dtype, "train.dtype"))
    except ConfigError:
        return cfg.train.dtype


def config_changes(saved: Config, current: Config, exempt=RESUME_EXEMPT) -> list[Change]:
    """Every field (outside `exempt`) whose value differs between two configs, sorted by name
    (`train.dtype` compared as resolved on each run's device)."""
    a, b = _flatten(to_dict(saved)), _flatten(to_dict(current))
    if a.get("train.dtype") != b.get("train.dtype"):
        a["train.dtype"], b["train.dtype"] = _run_dtype_name(saved), _run_dtype_name(current)
    return [Change(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and not matches_field(k, exempt)]


def check_resume_config(saved: Config, cfg: Config, step: int, ckpt: Path) -> list[Change]:
    """Raise CheckpointError naming every changed field that `train.resume_allow` does not list;
    log the allowed ones (and the learning rate before/after when the schedule changes)."""
    allow = [canonical_field(str(a)) for a in cfg.train.resume_allow]
    changes = config_changes(saved, cfg)
    refused = [c for c in changes if not matches_field(c.field, allow)]
    if refused:
        names = ",".join(c.field for c in refused)
        raise CheckpointError(
            f"checkpoint {ckpt} was written with another config; a resume continues the same run, so "
            f"these fields must match:\n  " + "\n  ".join(map(str, refused))
            + f"\nset them back, or allow the change on purpose with train.resume_allow=[{names}]")
    for c in changes:
        log.info("resume: %s changes from %r to %r (train.resume_allow)", c.field, c.old, c.new)
    if any(c.field == "train.max_steps" or c.field.startswith("optim.") for c in changes):
        before = lr_at(step, saved.optim, saved.train.max_steps)
        after = lr_at(step, cfg.optim, cfg.train.max_steps)
        log.info("resume: learning rate at step %d: %.4g before the change, %.4g after", step, before, after)
    for c in config_changes(saved, cfg, exempt=()):
        if matches_field(c.field, RESUME_EXEMPT) and not c.field.startswith(("train.resume", "logger.")):
            log.info("resume: %s is %r (checkpoint: %r)", c.field, c.new, c.old)
    return changes


def check_training_state(state: dict, ckpt: Path) -> None:
    """A checkpoint that lacks the training entries (an HF import, a weights-only file) cannot
    continue a run; say so instead of failing on a missing key later."""
    missing = [k for k in TRAINING_ENTRIES if k not in state]
    missing += [kinds[0] for kinds in (WEIGHTS, OPTIMIZER) if not any(k in state for k in kinds)]
    if missing:
        origin = f" (imported from {state['imported_from']})" if state.get("imported_from") else ""
        raise CheckpointError(f"{ckpt} is not a training checkpoint{origin}: it has no {'/'.join(missing)} entries, "
                              "so no run can resume from it; load its weights with moe.load_model instead")


def rng_state() -> dict:
    """Every RNG the training step draws from (torch, Python, numpy, CUDA)."""
    _, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]),
             "numpy": [torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(state["python"]), None))
    keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
