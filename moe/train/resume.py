"""What a resumed run restores and checks: RNG states, the checkpoint's entries, the whole config.

A resume continues the *same* run, so the config must be the checkpoint's. Only fields that
change neither what is trained nor the logged values may differ freely (`RESUME_EXEMPT`):
when to stop, log, evaluate and checkpoint, the logger, the run-control switches, and where the
run executes (device, compile, distributed layout: a checkpoint resumes at any world size). Any
other difference is an error naming the fields, unless `train.resume_allow` lists it; allowed
changes are logged, with the learning rate at the resumed step before and after when they
change the schedule (`optim.*`, `train.max_steps`).

Where the run executes is free, but what a field *means* there is not: the fields whose value
depends on the device (`RESOLVED_FIELDS`: `train.dtype=auto` is fp32 on a CPU and bf16 on a GPU,
`train.tf32` acts only on CUDA, `distributed.mixed_precision=auto` computes FSDP's parameters in bf16
only on CUDA with bf16) are compared as each run resolved them (the checkpoint records its own,
`resolved_settings`), so resuming a CPU run on a GPU is a change like any other.
Fields that change the parameters' shapes (`SHAPE_FIELDS`) cannot be allowed at all: a resume
loads the checkpoint's tensors as they are (a new shape from old weights is fine-tuning,
`train.init_from`).
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any, NamedTuple, Optional

import numpy as np
import torch

from moe.config import Config, canonical_field, to_dict
from moe.errors import CheckpointError, ConfigError
from moe.distributed.parallel import fsdp_param_dtype, uses_fsdp
from moe.dtypes import dtype_name
from moe.jsonl import flatten
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
    # observing the run: torch.profiler windows (moe/train/profile.py)
    "train.profile.",
)
# Model fields that change a parameter's shape or the set of parameters (tests/train/test_setup.py
# builds the model with each field changed and checks this list against its parameters).
SHAPE_FIELDS = (
    "model.vocab_size", "model.d_model", "model.n_layers", "model.n_heads", "model.n_kv_heads", "model.head_dim",
    "model.qkv_bias", "model.attn_out_bias", "model.qk_norm", "model.tie_embeddings", "model.n_experts",
    "model.expert_hidden", "model.n_shared_experts", "model.shared_expert_hidden", "model.shared_expert_gate",
    "model.n_dense_layers", "model.dense_layers", "model.dense_hidden", "model.attention_sinks", "model.expert_bias",
    "model.router_bias", "model.mtp_depth", "model.attention_kind", "model.q_lora_rank", "model.kv_lora_rank",
    "model.qk_nope_head_dim", "model.qk_rope_head_dim", "model.v_head_dim",
)
# Fields whose meaning depends on the device: compared as resolved (`resolved_settings`).
RESOLVED_FIELDS = ("train.dtype", "train.tf32", "distributed.mixed_precision")
# Resolved fields that only mean something in some layouts ("n/a" elsewhere): a resume may change the layout
# freely, so "n/a" on either side is no change; between two layouts that use it, a change is one.
LAYOUT_FIELDS = ("distributed.mixed_precision",)
TRAINING_ENTRIES = ("step", "data", "rng", "log_window", "config")
# Where the weights and the optimizer state are: a single file holds them; a distributed (DCP)
# checkpoint holds them by name, or in its shards (`dcp_path`, loaded in place).
WEIGHTS, OPTIMIZER = ("model", "dcp_path"), ("optimizer", "optimizer_by_name", "dcp_path")


class Change(NamedTuple):
    field: str
    old: Any
    new: Any
    resolved_on: str = ""  # a resolved value's device ("" for a config value)

    def __str__(self) -> str:
        if self.resolved_on:
            return (f"{self.field}: the checkpoint's run used {self.old!r}, this run resolves it to {self.new!r} "
                    f"on {self.resolved_on}")
        return f"{self.field}: checkpoint has {self.old!r}, config has {self.new!r}"


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
    a, b = flatten(to_dict(saved)), flatten(to_dict(current))
    if a.get("train.dtype") != b.get("train.dtype"):
        a["train.dtype"], b["train.dtype"] = _run_dtype_name(saved), _run_dtype_name(current)
    return [Change(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and not matches_field(k, exempt)]


def resolved_settings(cfg: Config, device: torch.device) -> dict:
    """The device-dependent fields (`RESOLVED_FIELDS`) as a run on `device` uses them; each
    checkpoint records its run's (`"resolved"`), so a resume compares what ran with what will."""
    return {"train.dtype": dtype_name(run_dtype(device, cfg.train.dtype, "train.dtype")),
            "train.tf32": ("on" if cfg.train.tf32 else "off") if device.type == "cuda" else "n/a",
            "distributed.mixed_precision": fsdp_param_dtype(cfg, device) if uses_fsdp(cfg) else "n/a",
            "device": device.type}


def resolved_changes(saved: Optional[dict], now: dict) -> list[Change]:
    """The `RESOLVED_FIELDS` whose resolved value differs (none for a checkpoint that predates the record,
    nor for a `LAYOUT_FIELDS` one that a layout on either side does not use)."""
    return [Change(f, saved[f], now[f], now.get("device", "this device")) for f in RESOLVED_FIELDS
            if saved and f in saved and saved[f] != now[f]
            and not (f in LAYOUT_FIELDS and "n/a" in (saved[f], now[f]))]


def _shape_advice(fields: list[str]) -> str:
    return (f"{', '.join(fields)} {'changes' if len(fields) == 1 else 'change'} the parameters' shapes: a resume loads "
            "the checkpoint's tensors as they are, so train.resume_allow cannot admit it; to start a new run from this "
            "checkpoint's weights in another shape, use train.init_from=<checkpoint> (fine-tuning) instead of "
            "train.resume")


def check_resume_config(saved: Config, cfg: Config, step: int, ckpt: Path, saved_resolved: Optional[dict] = None,
                        resolved: Optional[dict] = None) -> list[Change]:
    """Raise CheckpointError naming every changed field that `train.resume_allow` does not list,
    and every allowed one that changes parameter shapes; log the allowed ones (and the learning
    rate before/after when the schedule changes). `saved_resolved` / `resolved`: the checkpoint's
    and this run's `resolved_settings` (the device-dependent fields are then compared as resolved)."""
    allow = [canonical_field(str(a)) for a in cfg.train.resume_allow]
    changes = config_changes(saved, cfg)
    if saved_resolved and resolved:
        changes = sorted([c for c in changes if c.field not in RESOLVED_FIELDS]
                         + resolved_changes(saved_resolved, resolved), key=lambda c: c.field)
    refused = [c for c in changes if not matches_field(c.field, allow)]
    shaped = [c.field for c in changes if matches_field(c.field, SHAPE_FIELDS)]
    if refused:
        free = [c.field for c in refused if c.field not in shaped]
        advice = [f"set them back, or allow the change on purpose with train.resume_allow=[{','.join(free)}]"] \
            if free else ["set them back"]
        advice += [_shape_advice([f for f in shaped if f not in free])] if len(free) < len(refused) else []
        raise CheckpointError(
            f"checkpoint {ckpt} was written with another config; a resume continues the same run, so "
            f"these fields must match:\n  " + "\n  ".join(map(str, refused)) + "\n" + "\n".join(advice))
    if shaped:
        raise CheckpointError(f"checkpoint {ckpt}: train.resume_allow lists {', '.join(shaped)}, but "
                              + _shape_advice(shaped))
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


def check_resumed_vocab(saved: Config, cfg: Config, ckpt: Path) -> None:
    """`model.vocab_size=null` resolved from this run's tokenizer must be the checkpoint's (a
    checkpoint from before tokenizers were saved in it may meet another tokenizer)."""
    if saved.model.vocab_size != cfg.model.vocab_size:
        raise CheckpointError(f"checkpoint {ckpt}: model.vocab_size is {saved.model.vocab_size} there, "
                              f"{cfg.model.vocab_size} here (from this run's tokenizer); "
                              + _shape_advice(["model.vocab_size"]))


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
