"""`setup_run`: everything a run checks and builds before its first step, in the order that fails
fastest and leaves nothing behind.

Checks that need no data come first (the config's own refusals, the variants this machine can
run, the resume check against the checkpoint's config, compared as resolved on this device), then
the data (tokenisation can take hours at scale), the model, optimizer and the resumed state. The
run directory's files are written last, once everything has been accepted; a start that fails
removes what it created (moe/train/run_dir.py: `start_guard`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from moe.checkpoint import tokenizer_files
from moe.config import Config
from moe.data import TokenBatcher, prepare_data
from moe.data.chat.packing import forward_inputs
from moe.distributed import ParallelDims, Parallelized, build_model, init_distributed, parallelize
from moe.dtypes import dtype_name
from moe.errors import CheckpointError, ConfigError
from moe.loading import ModelSource, tokenizer_from_files
from moe.logging import NullLogger
from moe.model import Transformer, check_variants
from moe.perf import MFUMeter, device_defaults, resolve_device, resolve_peak
from moe.routing.metrics import RoutingWindow
from moe.routing.probe import RoutingProbe
from moe.routing.routers import Router
from moe.train import checkpointing
from moe.train.activation_checkpointing import apply_activation_checkpointing
from moe.train.init_from import initial_model, prepare_init_from
from moe.train.optim import build_optimizer, warmup_warning
from moe.train.resume import (check_resume_config, check_resumed_vocab, check_training_state, resolved_settings,
                              seed_everything, set_rng_state)
from moe.train.run_dir import JobInfo, RunPlan, follow_into, log_offsets, plan_run, start_guard, write_run_config
from moe.train.summary import start_message
from moe.train.trainable import apply_trainable, check_patterns
from moe.variants import from_dict, resolve

log = logging.getLogger("moe")


class Window:
    """Losses and routing records since the last log step (persisted in checkpoints)."""

    def __init__(self):
        self.routing = RoutingWindow()
        self.loss_sum = self.aux_sum = 0.0
        self.steps = 0

    def state_dict(self) -> dict:
        return {"loss_sum": self.loss_sum, "aux_sum": self.aux_sum, "steps": self.steps,
                "layers": self.routing.layers}

    def load_state_dict(self, d: dict) -> None:
        self.loss_sum, self.aux_sum, self.steps = d["loss_sum"], d["aux_sum"], d["steps"]
        self.routing.layers = d["layers"]

    def reset(self) -> None:
        self.__init__()


@torch.no_grad()
def evaluate(model, batches, device, autocast) -> float:
    was_training = model.training
    model.eval()
    losses = []
    for x, y, *extra in batches:  # packed chat rows add positions and segment ids (moe/data/chat/packing.py)
        with autocast():
            out = model(x.to(device), targets=y.to(device), return_logits=False, **forward_inputs(extra, device))
        losses.append(float(out.lm_loss))
    model.train(was_training)
    return sum(losses) / len(losses)


def autocast_context(device_type: str, bf16: bool):
    """bf16 autocast when the run's dtype is bf16, else nothing (use with functools.partial)."""
    return torch.autocast(device_type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


@dataclass
class RunParts:
    """What `setup_run` built: the run's place, data, model, optimizer and the resumed counters."""

    cfg: Config
    dims: ParallelDims
    plan: RunPlan
    data: Any
    model: Transformer
    par: Parallelized
    optimizer: torch.optim.Optimizer
    batcher: TokenBatcher
    val_batches: list
    my_val_batches: list  # this rank's share of them (all of them on one process)
    routers: list[Router]
    flops_per_token: float  # counted before any sharding
    resolved: dict  # the device-dependent settings as resolved here (moe/train/resume.py)
    summary: dict
    state: Optional[dict] = None  # the checkpoint's entries on a resume
    window: Window = field(default_factory=Window)
    step: int = 0
    val_loss: Optional[float] = None
    val_step: Optional[int] = None  # the step of the last validation (None: unknown, an older checkpoint)
    wandb_id: Optional[str] = None
    source: Optional[ModelSource] = None  # what train.init_from started a fresh run from
    hf: Optional[dict] = None  # the HF family record checkpoints keep (an HF source's), for `moe.hf export`
    t_wall: float = field(default_factory=time.perf_counter)
    # set by `finish_setup`
    fwd_model: Any = None
    autocast: Callable = contextlib.nullcontext
    probe: Optional[RoutingProbe] = None
    meter: Optional[MFUMeter] = None
    logger: Any = None

    @property
    def run_dir(self) -> Path:
        return self.plan.run_dir

    @property
    def device(self) -> torch.device:
        return self.dims.device

    @property
    def resumed(self) -> bool:
        return self.state is not None



def _prepare_data(cfg: Config, state: Optional[dict], distributed: bool = False, tokenizer=None):
    """The data, tokenised by `tokenizer` (train.init_from's) when given, and by the checkpoint's
    tokenizer on a resume (when the data cache's own tokenizer differs, e.g. retrained after the
    cache was cleared, the corpus is tokenised again).
    `distributed`: only read prepared data, never build it (every rank fails at once with how to
    prepare it, instead of all waiting on one rank's hours of tokenising and timing out)."""
    data = prepare_data(cfg.data, tokenizer=tokenizer, require_prepared=distributed)
    if state is None or not state.get("tokenizer"):
        return data
    if tokenizer_files(data.tokenizer) != state["tokenizer"]:
        log.warning("resume: the data cache's tokenizer differs from the checkpoint's; tokenising the corpus "
                    "with the checkpoint's tokenizer")
        try:
            data = prepare_data(cfg.data, tokenizer=tokenizer_from_files(state["tokenizer"]),
                                require_prepared=distributed)
        except ConfigError as e:
            raise ConfigError(f"{e}; here the corpus must be tokenised with the checkpoint's tokenizer: resume once "
                              "with distributed=none (it prepares that data), then distributed") from e
    n_tokens = [data.n_train_tokens, data.n_val_tokens]
    if state.get("data_tokens") not in (None, n_tokens) and "data" not in cfg.train.resume_allow:
        raise CheckpointError(f"the data changed since the checkpoint: it trained on {state['data_tokens'][0]:,} "
                              f"train / {state['data_tokens'][1]:,} val tokens, the data now has {n_tokens[0]:,} / "
                              f"{n_tokens[1]:,} (restore the corpus, or allow it with train.resume_allow=[data])")
    return data


def check_startable(cfg: Config) -> None:
    """Refusals that need neither data nor a checkpoint: before anything is read or written."""
    if cfg.model.router.drop_experts:
        raise ConfigError(f"router.drop_experts={list(cfg.model.router.drop_experts)} is an inference-time ablation "
                          "(python -m eval, the engine, the server); training with experts removed is not supported")
    # Variants that cannot run here (flash without a GPU, triton on a plain CPU) fail now,
    # before minutes of data preparation, with the registry's message.
    check_variants(cfg.model)


def read_and_check_state(cfg: Config, plan: RunPlan, dims: ParallelDims, resolved: dict) -> tuple[Optional[dict],
                                                                                                    list]:
    """The checkpoint's entries and the allowed config changes; every refusal before any data work."""
    if plan.checkpoint is None:
        return None, []
    state = checkpointing.read_state(plan.checkpoint, dims)
    check_training_state(state, plan.checkpoint)
    saved = from_dict(state["config"])
    # model.vocab_size=null is resolved from the tokenizer later, as it was for the saved run.
    current = cfg if cfg.model.vocab_size is not None else dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, vocab_size=saved.model.vocab_size))
    changes = check_resume_config(saved, current, state["step"], plan.checkpoint,
                                  saved_resolved=state.get("resolved"), resolved=resolved)
    return state, changes


def build_parts(cfg: Config, dims: ParallelDims, plan: RunPlan, data, state: Optional[dict],
                resolved: dict, source: Optional[ModelSource] = None) -> RunParts:
    """The model (initialised, or loaded from train.init_from's `source`, on rank 0; other ranks
    get only their shards), its parallel wrapping, the optimizer and the batchers."""
    tc = cfg.train
    # train.init_from: rank 0 (or the one process) reads the source; the others build on meta (build_model)
    # and receive their shards of its weights when parallelize lays the model out (fill_from_rank0).
    model = build_model(lambda: initial_model(cfg.model, source, dims.device) if source is not None and dims.is_main
                        else Transformer(cfg.model), dims)
    trainable = apply_trainable(model, tc.trainable)  # before any wrapping: DDP / FSDP see what is frozen
    apply_activation_checkpointing(model, tc.activation_checkpointing)  # before any wrapping: names unchanged
    flops_per_token = model.flops_per_token(tc.seq_len)  # counted before any sharding
    summary = {"run_dir": str(plan.run_dir), "params": model.num_params(), "active_params": model.num_params(active=True),
               "trainable_params": trainable}
    par = parallelize(model, dims, cfg)  # DDP / FSDP2 / expert parallel; `par.module` is `model` on one process
    optimizer = build_optimizer(model, cfg.optim, dims.device)
    routers = [m for m in model.modules() if isinstance(m, Router)]
    # train.batch_size is the global batch: each data-parallel rank reads its share of it.
    batcher = data.batcher(dims.local_batch, tc.seq_len, seed=cfg.seed, rank=dims.dp_rank, world_size=dims.dp_size)
    # Validation sees eval_batches full batches, run in micro-batches (so grad_accum does not change it).
    val_batches = data.eval_batches(tc.batch_size // tc.grad_accum, tc.seq_len, tc.eval_batches * tc.grad_accum)
    return RunParts(cfg, dims, plan, data, model, par, optimizer, batcher, val_batches, dims.shard(val_batches),
                    routers, flops_per_token, resolved, summary, state, source=source,
                    hf=(state or {}).get("hf") or (source.hf if source is not None else None))


def restore(parts: RunParts) -> None:
    """Continue from the checkpoint: weights, optimizer, data position, logging window, RNG, counters."""
    state = parts.state
    checkpointing.load_model_optimizer(parts.model, parts.optimizer, state, parts.par)
    parts.batcher.load_state_dict(state["data"])
    parts.window.load_state_dict(state["log_window"])
    set_rng_state(state["rng"])
    parts.step, parts.wandb_id = state["step"], state.get("wandb_id")
    parts.val_loss, parts.val_step = state.get("val_loss"), state.get("val_step")
    parts.summary["initial_val_loss"] = state.get("initial_val_loss")
    log.info("resumed from %s at step %d", parts.plan.checkpoint, parts.step)


def finish_setup(parts: RunParts, job: Optional[JobInfo], changes: list, logger_cls) -> None:
    """The run directory's files (rank 0 alone writes them), the logger, compile, the numeric
    defaults and the throughput meter."""
    cfg, tc, dims, device = parts.cfg, parts.cfg.train, parts.dims, parts.device
    parts.run_dir.mkdir(parents=True, exist_ok=True)
    if dims.is_main:
        write_run_config(cfg, parts.plan, job, parts.step, changes,
                         init_from=parts.source.describe() if parts.source is not None else None)
        parts.data.tokenizer.save(parts.run_dir / "tokenizer")
    parts.logger = logger_cls(cfg, parts.run_dir, resume_step=parts.step if parts.resumed else None,
                              wandb_id=parts.wandb_id) if dims.is_main else NullLogger()
    parts.fwd_model = torch.compile(parts.par.module) if tc.compile else parts.par.module
    dtype_used = dtype_name(device_defaults(device, tc.dtype, tc.tf32, what="train", field="train.dtype"))
    parts.autocast = functools.partial(autocast_context, device.type, dtype_used == "bf16")
    # Routing probes (moe/routing/probe.py): no RNG consumed, no model state changed.
    parts.probe = RoutingProbe(parts.model, parts.val_batches[0][0].to(device), parts.autocast)
    parts.probe.load_state_dict(parts.state.get("routing_probe") if parts.resumed else None)
    parts.meter = MFUMeter(resolve_peak(device, dtype_used, tc.peak_flops), parts.flops_per_token, dims.world_size)
    n_params, n_active = parts.summary["params"], parts.summary["active_params"]
    log.info("model: %.2fM parameters, %.2fM active per token; %s tokens train, %s val; %s", n_params / 1e6,
             n_active / 1e6, f"{parts.data.n_train_tokens:,}", f"{parts.data.n_val_tokens:,}",
             parts.meter.peak.describe())
    if (short := warmup_warning(cfg.optim, tc.max_steps)) and dims.is_main:
        log.warning(short)


def setup_run(cfg: Config, run_dir: Path, job: Optional[JobInfo], logger_cls) -> RunParts:
    """Check, plan and build a run (see the module docstring); a failure removes what it created."""
    requested = Path(run_dir)
    log_start = log_offsets(requested)  # before this run logs anything
    cfg = resolve(cfg)  # each variant's own options (moe/variants.py): a bad one fails here, before anything is written
    # train.init_from: the source's model config and tokenizer (no weights yet), checked before anything is written
    cfg, source = prepare_init_from(cfg, job.overrides if job is not None else [])
    check_startable(cfg)
    check_patterns(cfg.model, cfg.train.trainable)
    # distributed=none: one process, and every dims method is the single-process behaviour (moe/distributed/).
    dims = init_distributed(cfg, resolve_device(cfg.train.device))
    with start_guard(requested, main=dims.is_main):
        plan = dims.on_main(plan_run, cfg, requested, job)  # rank 0 decides for all
        follow_into(requested, plan.run_dir, log_start, main=dims.is_main)
        t_wall = time.perf_counter()
        if dims.is_main:
            log.info(start_message(plan.run_dir, plan.checkpoint))
        resolved = resolved_settings(cfg, dims.device)
        state, changes = read_and_check_state(cfg, plan, dims, resolved)
        seed_everything(cfg.seed)
        data = _prepare_data(cfg, state, distributed=dims.world_size > 1,
                             tokenizer=source.tokenizer if source is not None else None)
        if cfg.model.vocab_size is None:
            cfg.model.vocab_size = int(math.ceil(data.tokenizer.vocab_size / 64) * 64)  # aligned matmuls
        if cfg.model.vocab_size < data.tokenizer.vocab_size:
            raise ConfigError(f"model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's "
                              f"{data.tokenizer.vocab_size} tokens")
        if state is not None:
            check_resumed_vocab(from_dict(state["config"]), cfg, plan.checkpoint)
        parts = build_parts(cfg, dims, plan, data, state, resolved, source if state is None else None)
        parts.t_wall = t_wall
        if state is not None:
            restore(parts)
        finish_setup(parts, job, changes, logger_cls)
    return parts
