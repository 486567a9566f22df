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
import logging
import math
import time
from pathlib import Path
from typing import Optional

import torch

from moe.checkpoint import checkpoint_path, fault_pause, latest_checkpoint, list_checkpoints, prune_checkpoints, tokenizer_files
from moe.config import Config, to_dict
from moe.data import TokenBatcher, eval_batches, prepare_data
from moe.distributed import build_model, init_distributed, parallelize
from moe.errors import CheckpointError, ConfigError
from moe.jsonl import nonfinite_name, write_json
from moe.loading import tokenizer_from_files
from moe.logging import Logger, NullLogger, save_load_heatmap
from moe.routing.metrics import RoutingWindow
from moe.model import Transformer, check_variants
from moe.routing.routers import Router
from moe.routing.probe import RoutingProbe
from moe.variants import from_dict, resolve
from moe.dtypes import dtype_name
from moe.perf import MFUMeter, device_defaults, format_perf, resolve_device, resolve_peak
from moe.train import checkpointing
from moe.train.activation_checkpointing import apply_activation_checkpointing
from moe.train.optim import build_optimizer, lr_at, warmup_warning
from moe.train.preemption import PreemptionGuard
from moe.train.resume import check_resume_config, check_training_state, rng_state, seed_everything, set_rng_state
from moe.train.run_dir import JobInfo, follow_into, log_offsets, plan_run, write_run_config
from moe.train.signals import StopSignals
from moe.train.summary import closing_summary, start_message

log = logging.getLogger("moe")


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


def _prepare_data(cfg: Config, state: Optional[dict], distributed: bool = False):
    """The data, tokenised by the checkpoint's tokenizer on a resume (when the data cache's own
    tokenizer differs, e.g. retrained after the cache was cleared, the corpus is tokenised again).
    `distributed`: only read prepared data, never build it (every rank fails at once with how to
    prepare it, instead of all waiting on one rank's hours of tokenising and timing out)."""
    data = prepare_data(cfg.data, require_prepared=distributed)
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


def train(cfg: Config, run_dir: Path, job: Optional[JobInfo] = None) -> dict:
    """Train (or resume) according to `cfg`, writing into `run_dir` (or, on a resume, the resumed
    run's directory: see moe/train/run_dir.py); returns the summary. `job`: the launcher's overrides."""
    cfg = resolve(cfg)  # each variant's own options (moe/variants.py): a bad one fails here, before anything is written
    requested = Path(run_dir)
    log_start = log_offsets(requested)  # before this run logs anything
    tc = cfg.train
    if cfg.model.router.drop_experts:
        raise ConfigError(f"router.drop_experts={list(cfg.model.router.drop_experts)} is an inference-time ablation "
                          "(python -m eval, the engine, the server); training with experts removed is not supported")
    # distributed=none: one process, and every dims method is the single-process behaviour (moe/distributed/).
    dims = init_distributed(cfg, resolve_device(tc.device))
    plan = dims.on_main(plan_run, cfg, requested, job)  # rank 0 decides for all
    run_dir = plan.run_dir
    follow_into(requested, run_dir, log_start, main=dims.is_main)
    run_dir.mkdir(parents=True, exist_ok=True)
    t_wall = time.perf_counter()
    if dims.is_main:
        log.info(start_message(run_dir, plan.checkpoint))
    state = checkpointing.read_state(plan.checkpoint, dims) if plan.checkpoint else None
    if state is not None:
        check_training_state(state, plan.checkpoint)

    seed_everything(cfg.seed)
    device = dims.device
    # Variants that cannot run here (flash without a GPU, triton on a plain CPU) fail now,
    # before minutes of data preparation, with the registry's message.
    check_variants(cfg.model)
    data = _prepare_data(cfg, state, distributed=dims.world_size > 1)
    tokenizer = data.tokenizer
    if cfg.model.vocab_size is None:
        cfg.model.vocab_size = int(math.ceil(tokenizer.vocab_size / 64) * 64)  # aligned matmuls
    if cfg.model.vocab_size < tokenizer.vocab_size:
        raise ConfigError(f"model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's "
                          f"{tokenizer.vocab_size} tokens")
    changes = check_resume_config(from_dict(state["config"]), cfg, state["step"], plan.checkpoint) \
        if state is not None else []

    # Rank 0 initialises the model; other ranks build it on meta and get only their shards in parallelize.
    model = build_model(lambda: Transformer(cfg.model), dims)
    apply_activation_checkpointing(model, tc.activation_checkpointing)  # before any wrapping: names unchanged
    flops_per_token = model.flops_per_token(tc.seq_len)  # counted before any sharding
    n_params, n_active = model.num_params(), model.num_params(active=True)
    par = parallelize(model, dims, cfg)  # DDP / FSDP2 / expert parallel; `par.module` is `model` on one process
    train_model = par.module
    optimizer = build_optimizer(model, cfg.optim, device)
    routers = [m for m in model.modules() if isinstance(m, Router)]
    micro_bs = tc.batch_size // tc.grad_accum
    n_micro = dims.local_accum  # micro-batches per rank and step (tc.grad_accum on one process)
    # train.batch_size is the global batch: each data-parallel rank reads its share of it.
    batcher = TokenBatcher(data.train_tokens(), dims.local_batch, tc.seq_len, seed=cfg.seed,
                           rank=dims.dp_rank, world_size=dims.dp_size)
    # Validation sees eval_batches full batches, run in micro-batches (so grad_accum does not change it).
    val_batches = eval_batches(data.val_tokens(), micro_bs, tc.seq_len, tc.eval_batches * tc.grad_accum)
    my_val_batches = dims.shard(val_batches)  # this rank's share (all of them on one process)
    window = _Window()
    step, wandb_id = 0, None
    summary: dict = {"run_dir": str(run_dir), "params": n_params, "active_params": n_active}
    val_loss = None
    if state is not None:
        checkpointing.load_model_optimizer(model, optimizer, state, par)
        batcher.load_state_dict(state["data"])
        window.load_state_dict(state["log_window"])
        set_rng_state(state["rng"])
        step, wandb_id = state["step"], state.get("wandb_id")
        val_loss, summary["initial_val_loss"] = state.get("val_loss"), state.get("initial_val_loss")
        log.info("resumed from %s at step %d", plan.checkpoint, step)

    if dims.is_main:  # rank 0 alone writes the run's files and logs
        write_run_config(cfg, plan, job, step, changes)
        tokenizer.save(run_dir / "tokenizer")
    logger = Logger(cfg, run_dir, resume_step=step if state else None, wandb_id=wandb_id) if dims.is_main \
        else NullLogger()
    fwd_model = torch.compile(train_model) if tc.compile else train_model
    dtype_used = dtype_name(device_defaults(device, tc.dtype, tc.tf32, what="train", field="train.dtype"))
    use_bf16 = dtype_used == "bf16"

    def autocast():
        if use_bf16:
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # Routing probes (moe/routing/probe.py): no RNG consumed, no model state changed.
    probe = RoutingProbe(model, val_batches[0][0].to(device), autocast)
    probe.load_state_dict(state.get("routing_probe") if state is not None else None)

    meter = MFUMeter(resolve_peak(device, dtype_used, tc.peak_flops), flops_per_token, dims.world_size)
    log.info("model: %.2fM parameters, %.2fM active per token; %s tokens train, %s val; %s",
             n_params / 1e6, n_active / 1e6, f"{data.n_train_tokens:,}", f"{data.n_val_tokens:,}",
             meter.peak.describe())
    if (short := warmup_warning(cfg.optim, tc.max_steps)) and dims.is_main:
        log.warning(short)
    end_step = min(tc.max_steps, tc.stop_after) if tc.stop_after else tc.max_steps
    tokens_per_step = tc.batch_size * tc.seq_len
    last_loads, train_loss = None, None
    saved_step = step if state is not None else None

    def save(step_: int, data_state: dict, rng: dict) -> Path:
        nonlocal saved_step
        path = checkpointing.save(run_dir, step_, model, optimizer, {
            "model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step_,
            "data": data_state, "rng": rng, "config": to_dict(cfg), "data_tokens": [data.n_train_tokens,
                                                                                  data.n_val_tokens],
            "tokenizer": tokenizer_files(tokenizer), "log_window": window.state_dict(), "wandb_id": logger.wandb_id,
            "routing_probe": probe.state_dict(), "val_loss": val_loss,
            "initial_val_loss": summary.get("initial_val_loss"),
        }, par)
        saved_step = step_
        if dims.is_main:
            prune_checkpoints(run_dir, tc.keep_last)
        return path

    if state is None:
        val_loss = dims.mean(evaluate(fwd_model, my_val_batches, device, autocast))
        logger.log({"step": 0, "val/loss": val_loss, "val/ppl": math.exp(min(val_loss, 50))})
        log.info("step 0 | val loss %.4f", val_loss)
        summary["initial_val_loss"] = val_loss
        probe.stability()  # reference selections for the first stability measurement

    model.train()
    # Throughput counts only the time spent in training steps, not validation or checkpoints.
    step_seconds, steps_in_timer, t_start = 0.0, 0, time.perf_counter()
    # SIGINT/SIGTERM (StopSignals) and the cluster's preemption signal (PreemptionGuard: USR2 before a
    # SLURM time limit) both stop the run at the end of a step, with a checkpoint every rank writes.
    signals, guard, nonfinite = StopSignals(), PreemptionGuard(), None
    with signals, guard:
        while step < end_step:
            t_step = time.perf_counter()
            before = batcher.state_dict(), rng_state()  # the last good step's, for a stop on a non-finite loss
            lr = lr_at(step, cfg.optim, tc.max_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x_BT, y_BT = batcher.next_batch()
            step_loss = step_aux = 0.0
            records = []
            for i, (x, y) in enumerate(zip(x_BT.to(device).chunk(n_micro), y_BT.to(device).chunk(n_micro))):
                with par.grad_sync(i == n_micro - 1):  # gradients are synchronised after the last micro-batch
                    with autocast():
                        out = fwd_model(x, targets=y, return_logits=False)
                    (out.loss / n_micro).backward()
                step_loss += float(out.lm_loss.detach()) / n_micro
                step_aux += float(out.aux_loss.detach()) / n_micro if out.aux_loss is not None else 0.0
                records.append(dims.reduce_records(out.moe_records))  # the global load, not this rank's
            step_loss, step_aux = dims.mean(step_loss, step_aux)  # the global batch's
            par.after_backward(model)  # EP expert gradients, router load counts (nothing on one process)
            grad_norm = par.clip_grad_norm_(model, cfg.optim.grad_clip) if cfg.optim.grad_clip > 0 else None
            norm = float(grad_norm) if grad_norm is not None and tc.stop_on_nan else 0.0
            if tc.stop_on_nan and not (math.isfinite(step_loss) and math.isfinite(norm)):
                what, bad = ("loss", step_loss) if not math.isfinite(step_loss) else ("grad_norm", norm)
                nonfinite = {"step": step + 1, "what": what, "value": nonfinite_name(bad)}
                # The weights are still the last good step's: checkpoint it as it was before this step.
                path = save(step, *before) if saved_step != step else checkpoint_path(run_dir, step)
                nonfinite["checkpoint"] = str(path)
                log.error("the %s became %s at step %d: stopped (train.stop_on_nan); the checkpoint of step %d, "
                          "the last good one, is %s; lower optim.lr or check the data", nonfinite["what"],
                          nonfinite["value"], step + 1, step, path)
                break
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            for router in routers:
                router.after_step()  # non-gradient updates, e.g. aux-loss-free balancing biases
            step += 1
            for r in records:
                window.routing.add(r)
            steps_in_timer += 1
            step_seconds += time.perf_counter() - t_step
            window.loss_sum += step_loss
            window.aux_sum += step_aux
            window.steps += 1

            # Logging and validation follow the intervals only: a stop (stop_after, a signal) adds no
            # record, and the checkpoint carries the open logging window, so a resumed run logs what
            # an uninterrupted one would.
            record: dict = {}
            if step % tc.log_interval == 0 or step == tc.max_steps:
                tok_s = steps_in_timer * tokens_per_step / step_seconds
                throughput = meter.measure(tok_s)  # perf/model_flops_per_s, and perf/mfu when there is a peak
                routing, last_loads = window.routing.summarize()
                record.update({"train/loss": window.loss_sum / window.steps,
                               "train/aux_loss": window.aux_sum / window.steps,
                               "train/lr": lr, "perf/tokens_per_s": tok_s, **throughput,
                               "train/tokens": step * tokens_per_step, **routing})
                if grad_norm is not None:
                    record["train/grad_norm"] = float(grad_norm)
                record.update(dims.mean_dict(probe.overlap(x)))  # train vs eval routing on the last micro-batch
                eta = (end_step - step) * step_seconds / steps_in_timer
                log.info("step %d/%d | loss %.4f | lr %.2e | %s tok/s | %s | imbalance %.2f | eta %s",
                         step, tc.max_steps, record["train/loss"], lr, f"{tok_s:,.0f}", format_perf(throughput),
                         routing.get("moe/load_imbalance", float("nan")), _fmt_eta(eta))
                train_loss = record["train/loss"]
                window.reset()
                step_seconds, steps_in_timer = 0.0, 0
            heatmap = None
            if step % tc.eval_interval == 0 or step == tc.max_steps:
                val_loss = dims.mean(evaluate(fwd_model, my_val_batches, device, autocast))
                record.update({"val/loss": val_loss, "val/ppl": math.exp(min(val_loss, 50)), **probe.stability()})
                log.info("step %d | val loss %.4f | val ppl %.2f", step, val_loss, record["val/ppl"])
                if last_loads and dims.is_main:
                    heatmap = save_load_heatmap(last_loads, run_dir / "plots" / "load_heatmap.png", step)
            if record:
                record = {"step": step, **record}
                logger.log(record, loads=last_loads if "train/loss" in record else None, heatmap=heatmap)
            fault_pause("step-end", step, run_dir, until=lambda: bool(signals.requested or guard.received))
            asked = float(signals.requested or guard.received)
            stopping = step >= end_step or (dims.mean(asked) > 0 if dims.many else asked > 0)
            if step % tc.ckpt_interval == 0 or stopping:
                save(step, batcher.state_dict(), rng_state())
            if stopping:
                break

    summary.update({"step": step, "max_steps": tc.max_steps, "final_train_loss": train_loss,
                    "final_val_loss": val_loss, "train_seconds": time.perf_counter() - t_start,
                    "wall_seconds": time.perf_counter() - t_wall, "stopped_early": step < tc.max_steps,
                    "checkpoints": [str(p) for p in list_checkpoints(run_dir)], "wandb": logger.wandb_location,
                    "routing_alerts": logger.alerts})
    if nonfinite:
        summary["stopped_nonfinite"] = nonfinite
    summary["preempted"] = guard.received
    if guard.received:
        log.warning("stopped at step %d for the preemption signal; checkpoint written", step)
    if signals.requested:
        summary.update({"signal": signals.name, "exit_code": signals.exit_code(tc.exit_zero_on_signal)})
        log.warning("stopped by %s after step %d with checkpoint %s; to continue, run the same command with "
                    "train.resume=%s", signals.name, step, latest_checkpoint(run_dir), run_dir)
    if dims.is_main:
        write_json(run_dir / "summary.json", summary)
        log.info(closing_summary(summary))
    logger.close()
    dims.close()
    guard.hand_over()  # in a submitit job: its requeue handler (rank 0 exits there); a no-op otherwise
    return summary
