"""The training loop.

Stages of `train`: seed -> data (tokenizer + packed tokens) -> model + optimizer ->
optionally resume (weights, optimizer, step, data position, RNG, logging window) ->
steps (micro-batches with gradient accumulation, clip, AdamW, schedule) with periodic
logging, validation and atomic checkpoints -> final checkpoint and `summary.json`.
Everything a resumed run needs is in the checkpoint, so a resumed run logs exactly the
numbers an uninterrupted one would.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from moe.checkpoint import (CheckpointError, config_differences, latest_checkpoint, list_checkpoints,
                            prune_checkpoints, resolve_checkpoint, tokenizer_files)
from moe.attention import ATTENTION_BACKENDS
from moe.config import Config, ConfigError, to_dict
from moe.experts import EXPERT_DISPATCH
from moe.distributed import NullLogger, init_distributed
from moe.logging import Logger, save_load_heatmap
from moe.metrics import RoutingWindow
from moe.model import Transformer
from moe.routers import Router
from moe.routing_probe import RoutingProbe
from moe.perf import measure_matmul_peak, resolve_device
from moe.train.optim import lr_at

log = logging.getLogger("moe")


def find_resume_checkpoint(resume: Optional[str], run_dir: Path) -> tuple[Optional[Path], Path]:
    """Resolve `train.resume` to (checkpoint, run directory to continue in).

    `auto`: the newest checkpoint of this run directory, else of the most recent sibling
    run (so `python train.py train.resume=auto` continues the latest run without naming
    it); nothing found means a fresh start. A path: that file or run directory (must exist).
    """
    if resume is None:
        return None, run_dir
    if resume == "auto":
        ckpt = latest_checkpoint(run_dir)
        if ckpt is not None:
            return ckpt, run_dir
        siblings = [d for d in run_dir.parent.iterdir() if d.is_dir() and d != run_dir] if run_dir.parent.is_dir() else []
        found = [(c.stat().st_mtime, c, d) for d in siblings if (c := latest_checkpoint(d)) is not None]
        if found:
            _, ckpt, d = max(found)
            return ckpt, d
        log.info("train.resume=auto: no checkpoint found near %s; starting from scratch", run_dir)
        return None, run_dir
    try:
        ckpt = resolve_checkpoint(resume)
    except CheckpointError as e:
        raise CheckpointError(f"train.resume={resume!r}: {e}") from None
    return ckpt, ckpt.parent.parent


def _rng_state() -> dict:
    _, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]),
             "numpy": [torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
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


def _fmt_eta(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class _Window:
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
    for x, y in batches:
        with autocast():
            out = model(x.to(device), targets=y.to(device), return_logits=False)
        losses.append(float(out.lm_loss))
    model.train(was_training)
    return sum(losses) / len(losses)


def train(cfg: Config, run_dir: Path) -> dict:
    """Train (or resume) according to `cfg`, writing into `run_dir`; returns the summary."""
    from moe.data import TokenBatcher, eval_batches, prepare_data

    run_dir = Path(run_dir)
    tc = cfg.train
    # distributed=none: one process, and every ctx method is the single-process behaviour (moe/distributed/).
    ctx = init_distributed(cfg, resolve_device(tc.device))
    resume_ckpt, run_dir = ctx.on_main(find_resume_checkpoint, tc.resume, run_dir)  # rank 0 decides for all
    run_dir.mkdir(parents=True, exist_ok=True)
    state = ctx.read_checkpoint(resume_ckpt) if resume_ckpt else None

    seed_everything(cfg.seed)
    device = ctx.device
    # Variants that cannot run here (flash without a GPU, triton on a plain CPU) fail now,
    # before minutes of data preparation, with the registry's message.
    ATTENTION_BACKENDS.get(cfg.attention.name)
    EXPERT_DISPATCH.get(cfg.experts.name)
    data = prepare_data(cfg.data)
    tokenizer = data.tokenizer
    if cfg.model.vocab_size is None:
        cfg.model.vocab_size = int(math.ceil(tokenizer.vocab_size / 64) * 64)  # aligned matmuls
    if cfg.model.vocab_size < tokenizer.vocab_size:
        raise ConfigError(f"model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's "
                          f"{tokenizer.vocab_size} tokens")
    if state is not None:
        diffs = config_differences(state["config"], to_dict(cfg))
        if diffs:
            raise CheckpointError(f"checkpoint {resume_ckpt} is incompatible with the current config:\n  "
                                  + "\n  ".join(diffs))

    model = Transformer(cfg.model, cfg.router, cfg.attention.name, cfg.experts.name).to(device)
    flops_per_token = model.flops_per_token(tc.seq_len)  # counted before any sharding
    n_params, n_active = model.num_params(), model.num_params(active=True)
    train_model = ctx.parallelize(model, cfg)  # DDP / FSDP2 / expert parallel; `model` itself on one process
    optimizer = ctx.build_optimizer(model, cfg.optim, device)  # build_optimizer (+ EP param groups)
    routers = [m for m in model.modules() if isinstance(m, Router)]
    micro_bs = tc.batch_size // tc.grad_accum
    n_micro = ctx.local_accum  # micro-batches per rank and step (tc.grad_accum on one process)
    # train.batch_size is the global batch: each data-parallel rank reads its share of it.
    batcher = TokenBatcher(data.train_tokens(), ctx.local_batch, tc.seq_len, seed=cfg.seed,
                           rank=ctx.dp_rank, world_size=ctx.dp_size)
    # Validation sees eval_batches full batches, run in micro-batches (so grad_accum does not change it).
    val_batches = eval_batches(data.val_tokens(), micro_bs, tc.seq_len, tc.eval_batches * tc.grad_accum)
    my_val_batches = ctx.shard(val_batches)  # this rank's share (all of them on one process)
    window = _Window()
    step, wandb_id = 0, None
    if state is not None:
        ctx.load_model_optimizer(model, optimizer, state)
        batcher.load_state_dict(state["data"])
        window.load_state_dict(state["log_window"])
        _set_rng_state(state["rng"])
        step, wandb_id = state["step"], state.get("wandb_id")
        log.info("resumed from %s at step %d", resume_ckpt, step)

    if ctx.is_main:  # rank 0 alone writes the run's files and logs
        (run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
        tokenizer.save(run_dir / "tokenizer")
    logger = Logger(cfg, run_dir, resume_step=step if state else None, wandb_id=wandb_id) if ctx.is_main \
        else NullLogger()
    fwd_model = torch.compile(train_model) if tc.compile else train_model
    use_bf16 = tc.dtype == "bf16"

    def autocast():
        if use_bf16:
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # Routing probes (moe/routing_probe.py): no RNG consumed, no model state changed.
    probe = RoutingProbe(model, val_batches[0][0].to(device), autocast)
    probe.load_state_dict(state.get("routing_probe") if state is not None else None)

    peak = tc.peak_flops or measure_matmul_peak(device.type, tc.dtype)
    log.info("model: %.2fM parameters, %.2fM active per token; %s tokens train, %s val; peak %.1f GFLOP/s",
             n_params / 1e6, n_active / 1e6, f"{data.n_train_tokens:,}", f"{data.n_val_tokens:,}", peak / 1e9)
    end_step = min(tc.max_steps, tc.stop_after) if tc.stop_after else tc.max_steps
    tokens_per_step = tc.batch_size * tc.seq_len
    last_loads, val_loss = None, None
    summary: dict = {"run_dir": str(run_dir), "params": n_params, "active_params": n_active}

    def save(step_: int) -> None:
        ctx.save_checkpoint(run_dir, step_, model, optimizer, {
            "model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step_,
            "data": batcher.state_dict(), "rng": _rng_state(), "config": to_dict(cfg),
            "tokenizer": tokenizer_files(tokenizer), "log_window": window.state_dict(), "wandb_id": logger.wandb_id,
            "routing_probe": probe.state_dict(),
        })
        if ctx.is_main:
            prune_checkpoints(run_dir, tc.keep_last)

    if state is None:
        val_loss = ctx.mean(evaluate(fwd_model, my_val_batches, device, autocast))
        logger.log({"step": 0, "val/loss": val_loss, "val/ppl": math.exp(min(val_loss, 50))})
        log.info("step 0 | val loss %.4f", val_loss)
        summary["initial_val_loss"] = val_loss
        probe.stability()  # reference selections for the first stability measurement

    model.train()
    # Throughput counts only the time spent in training steps, not validation or checkpoints.
    step_seconds, steps_in_timer, t_start = 0.0, 0, time.perf_counter()
    while step < end_step:
        t_step = time.perf_counter()
        lr = lr_at(step, cfg.optim, tc.max_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x_BT, y_BT = batcher.next_batch()
        step_loss = step_aux = 0.0
        for i, (x, y) in enumerate(zip(x_BT.to(device).chunk(n_micro), y_BT.to(device).chunk(n_micro))):
            with ctx.grad_sync(i == n_micro - 1):  # gradients are synchronised after the last micro-batch
                with autocast():
                    out = fwd_model(x, targets=y, return_logits=False)
                (out.loss / n_micro).backward()
            step_loss += float(out.lm_loss.detach()) / n_micro
            step_aux += float(out.aux_loss.detach()) / n_micro if out.aux_loss is not None else 0.0
            window.routing.add(ctx.reduce_records(out.moe_records))  # the global load, not this rank's
        step_loss, step_aux = ctx.mean(step_loss, step_aux)  # the global batch's
        if not math.isfinite(step_loss):
            raise FloatingPointError(f"loss became {step_loss} at step {step + 1}; lower optim.lr or check the data")
        ctx.after_backward(model)  # EP expert gradients, router load counts (nothing on one process)
        grad_norm = ctx.clip_grad_norm_(model, cfg.optim.grad_clip) if cfg.optim.grad_clip > 0 else None
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        for router in routers:
            router.after_step()  # non-gradient updates, e.g. aux-loss-free balancing biases
        step += 1
        steps_in_timer += 1
        step_seconds += time.perf_counter() - t_step
        window.loss_sum += step_loss
        window.aux_sum += step_aux
        window.steps += 1

        record: dict = {}
        if step % tc.log_interval == 0 or step == end_step:
            tok_s = steps_in_timer * tokens_per_step / step_seconds
            mfu = flops_per_token * tok_s / (peak * ctx.world_size)  # peak is one device's
            routing, last_loads = window.routing.summarize()
            record.update({"train/loss": window.loss_sum / window.steps, "train/aux_loss": window.aux_sum / window.steps,
                           "train/lr": lr, "perf/tokens_per_s": tok_s, "perf/mfu": mfu,
                           "train/tokens": step * tokens_per_step, **routing})
            if grad_norm is not None:
                record["train/grad_norm"] = float(grad_norm)
            record.update(ctx.mean_dict(probe.overlap(x)))  # train vs eval routing on the last micro-batch
            eta = (end_step - step) * step_seconds / steps_in_timer
            log.info("step %d/%d | loss %.4f | lr %.2e | %s tok/s | mfu %.1f%% | imbalance %.2f | eta %s",
                     step, tc.max_steps, record["train/loss"], lr, f"{tok_s:,.0f}", 100 * mfu,
                     routing.get("moe/load_imbalance", float("nan")), _fmt_eta(eta))
            window.reset()
            step_seconds, steps_in_timer = 0.0, 0
        heatmap = None
        if step % tc.eval_interval == 0 or step == end_step:
            val_loss = ctx.mean(evaluate(fwd_model, my_val_batches, device, autocast))
            record.update({"val/loss": val_loss, "val/ppl": math.exp(min(val_loss, 50))})
            log.info("step %d | val loss %.4f | val ppl %.2f", step, val_loss, record["val/ppl"])
            if step % tc.eval_interval == 0 or step == tc.max_steps:  # not at a stop_after stop
                record.update(probe.stability())
            if last_loads and ctx.is_main:
                heatmap = save_load_heatmap(last_loads, run_dir / "plots" / "load_heatmap.png", step)
        if record:
            record = {"step": step, **record}
            logger.log(record, loads=last_loads if "train/loss" in record else None, heatmap=heatmap)
        if step % tc.ckpt_interval == 0 or step == end_step:
            save(step)

    summary.update({"step": step, "final_val_loss": val_loss, "train_seconds": time.perf_counter() - t_start,
                    "stopped_early": step < tc.max_steps, "checkpoints": [str(p) for p in list_checkpoints(run_dir)]})
    if ctx.is_main:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    logger.close()
    ctx.close()
    return summary
