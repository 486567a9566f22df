"""The training loop, as short named steps (torchtitan's Trainer style).

`train` = `setup_run` (moe/train/setup.py: checks, run directory, data, model, optimizer, resume)
-> a first validation on a fresh run -> per step `Trainer.train_step` (`forward_backward_step`
per micro-batch, clip, AdamW, schedule), `evaluate_and_log` (the logging and validation
intervals) and `checkpoint_if_due` (the checkpoint interval, or a stop) -> `finish`
(`summary.json`, the closing summary). Everything a resumed run needs is in the checkpoint, so a
resumed run logs exactly the numbers an uninterrupted one would.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import NamedTuple, Optional

import torch

from moe.checkpoint import checkpoint_path, fault_pause, prune_checkpoints, tokenizer_files
from moe.config import Config, to_dict
from moe.data.chat.packing import forward_inputs
from moe.jsonl import nonfinite_name
from moe.logging import Logger, save_load_heatmap
from moe.perf import format_perf
from moe.profiling import stage
from moe.train import checkpointing
from moe.train.mtp_metrics import MTPWindow, mtp_coef_at, mtp_loss
from moe.train.optim import lr_at
from moe.train.preemption import PreemptionGuard
from moe.train.profile import profile_run
from moe.train.resume import rng_state
from moe.train.run_dir import JobInfo
from moe.train.setup import RunParts, _prepare_data, evaluate, log, setup_run  # noqa: F401 (_prepare_data: tests)
from moe.train.signals import StopSignals
from moe.train.summary import finish_summary


def _fmt_eta(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class StepStats(NamedTuple):
    """What one optimizer step leaves for its logging record."""

    lr: float
    grad_norm: Optional[torch.Tensor]
    last_x: torch.Tensor  # the last micro-batch's inputs (the train-vs-eval routing probe)


class Trainer:
    """One run's training state: the parts `setup_run` built, the step, the last losses, the
    throughput timer; each method is one named step of the loop."""

    def __init__(self, parts: RunParts):
        self.parts, self.cfg, self.tc, self.dims = parts, parts.cfg, parts.cfg.train, parts.dims
        self.run_dir, self.model, self.optimizer, self.logger = parts.run_dir, parts.model, parts.optimizer, parts.logger
        self.step, self.val_loss, self.val_step = parts.step, parts.val_loss, parts.val_step
        self.train_loss, self.last_loads, self.nonfinite = None, None, None
        self.saved_step = parts.step if parts.resumed else None
        self.end_step = min(self.tc.max_steps, self.tc.stop_after) if self.tc.stop_after else self.tc.max_steps
        self.tokens_per_step = self.tc.batch_size * self.tc.seq_len
        # Throughput counts only the time spent in training steps, not validation or checkpoints.
        self.step_seconds, self.steps_in_timer = 0.0, 0
        # multi-token prediction (model.mtp_depth): per-depth losses and accuracies of the logging window
        self.mtp_window = MTPWindow(self.cfg.model.mtp_depth)
        self.mtp_window.load_state_dict(parts.state.get("mtp_window") if parts.resumed else None)
        if self.cfg.model.mtp_depth and not (self.tc.mtp_loss_coef or self.tc.mtp_loss_coef_after):
            log.warning("model.mtp_depth=%d with train.mtp_loss_coef=0: the MTP modules are not trained (their "
                        "losses are logged); set e.g. train.mtp_loss_coef=0.3", self.cfg.model.mtp_depth)

    # --- validation and checkpoints

    def validate(self) -> float:
        p = self.parts
        self.val_loss = self.dims.mean(evaluate(p.fwd_model, p.my_val_batches, p.device, p.autocast))
        self.val_step = self.step
        return self.val_loss

    def first_validation(self) -> None:
        """Step 0 of a fresh run: the loss before training, and the probe's reference selections."""
        val_loss = self.validate()
        self.logger.log({"step": 0, "val/loss": val_loss, "val/ppl": math.exp(min(val_loss, 50))})
        log.info("step 0 | val loss %.4f", val_loss)
        self.parts.summary["initial_val_loss"] = val_loss
        self.parts.probe.stability()  # reference selections for the first stability measurement

    def save(self, step: int, data_state: dict, rng: dict) -> Path:
        p = self.parts
        path = checkpointing.save(self.run_dir, step, self.model, self.optimizer, {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": step,
            "data": data_state, "rng": rng, "config": to_dict(self.cfg),
            "data_tokens": [p.data.n_train_tokens, p.data.n_val_tokens],
            "tokenizer": tokenizer_files(p.data.tokenizer), "log_window": p.window.state_dict(),
            "wandb_id": self.logger.wandb_id, "routing_probe": p.probe.state_dict(), "val_loss": self.val_loss,
            "val_step": self.val_step, "initial_val_loss": p.summary.get("initial_val_loss"),
            "resolved": p.resolved, "mtp_window": self.mtp_window.state_dict(), **({"hf": p.hf} if p.hf else {}),
        }, p.par)
        self.saved_step = step
        if self.dims.is_main:
            prune_checkpoints(self.run_dir, self.tc.keep_last)
        return path

    def checkpoint_if_due(self, stopping: bool) -> None:
        if self.step % self.tc.ckpt_interval == 0 or stopping:
            self.save(self.step, self.parts.batcher.state_dict(), rng_state())

    # --- one optimizer step

    def forward_backward_step(self, x_BT: torch.Tensor, y_BT: torch.Tensor, *extra_BT: torch.Tensor
                              ) -> tuple[float, float, list, torch.Tensor]:
        """Forward and backward over the step's micro-batches; returns the global batch's mean LM
        and aux losses, each micro-batch's routing records (the global load, not this rank's) and
        the last micro-batch's inputs. With MTP modules the loss adds lambda / D * sum_k CE_k
        (`train.mtp_loss_coef`), and the depths' losses and accuracies go to `mtp_window`."""
        p, n_micro = self.parts, self.dims.local_accum  # micro-batches per rank (tc.grad_accum on one process)
        step_loss = step_aux = 0.0
        records = []
        depth, coef = self.cfg.model.mtp_depth, mtp_coef_at(self.tc, self.step + 1)
        mtp_sums = [0.0] * (2 * depth)  # per depth: loss, then accuracy
        # packed chat rows add positions and segment ids after (x, y) (moe/data/chat/packing.py)
        chunks = [t.to(p.device).chunk(n_micro) for t in (x_BT, y_BT, *extra_BT)]
        for i, (x, y, *extra) in enumerate(zip(*chunks)):
            with p.par.grad_sync(i == n_micro - 1):  # gradients are synchronised after the last micro-batch
                with stage("forward"), p.autocast():
                    out = p.fwd_model(x, targets=y, return_logits=False, **forward_inputs(extra))
                mtp_term = mtp_loss(coef, out.mtp_losses)
                loss = out.loss if mtp_term is None else out.loss + mtp_term
                with stage("backward"):
                    (loss / n_micro).backward()
            step_loss += float(out.lm_loss.detach()) / n_micro
            step_aux += float(out.aux_loss.detach()) / n_micro if out.aux_loss is not None else 0.0
            for k, value in enumerate([*out.mtp_losses, *out.mtp_accuracies]):
                mtp_sums[k] += float(value.detach()) / n_micro
            records.append(self.dims.reduce_records(out.moe_records))
        step_loss, step_aux, *mtp_sums = self.dims.mean(step_loss, step_aux, *mtp_sums)  # the global batch's
        self.mtp_window.add(mtp_sums[:depth], mtp_sums[depth:])
        return step_loss, step_aux, records, x

    def stop_on_nonfinite(self, step_loss: float, grad_norm, before: tuple) -> bool:
        """With train.stop_on_nan: a non-finite loss or gradient norm stops the run with a
        checkpoint of the last good step (the weights are still its own). True when stopped."""
        norm = float(grad_norm) if grad_norm is not None and self.tc.stop_on_nan else 0.0
        if not self.tc.stop_on_nan or (math.isfinite(step_loss) and math.isfinite(norm)):
            return False
        what, bad = ("loss", step_loss) if not math.isfinite(step_loss) else ("grad_norm", norm)
        self.nonfinite = {"step": self.step + 1, "what": what, "value": nonfinite_name(bad)}
        path = self.save(self.step, *before) if self.saved_step != self.step else checkpoint_path(self.run_dir,
                                                                                                  self.step)
        self.nonfinite["checkpoint"] = str(path)
        log.error("the %s became %s at step %d: stopped (train.stop_on_nan); the checkpoint of step %d, the last "
                  "good one, is %s; lower optim.lr or check the data", what, self.nonfinite["value"], self.step + 1,
                  self.step, path)
        return True

    def train_step(self) -> Optional[StepStats]:
        """One optimizer step; None when it stopped the run on a non-finite value."""
        p, t_step = self.parts, time.perf_counter()
        before = p.batcher.state_dict(), rng_state()  # the last good step's, for a stop on a non-finite loss
        lr = lr_at(self.step, self.cfg.optim, self.tc.max_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        step_loss, step_aux, records, x_last = self.forward_backward_step(*p.batcher.next_batch())
        p.par.after_backward(self.model)  # EP expert gradients, router load counts (nothing on one process)
        with stage("optimizer"):  # the clip's norm, AdamW, zero_grad
            grad_norm = p.par.clip_grad_norm_(self.model, self.cfg.optim.grad_clip) if self.cfg.optim.grad_clip > 0 \
                else None
            if self.stop_on_nonfinite(step_loss, grad_norm, before):
                return None
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        for router in p.routers:
            router.after_step()  # non-gradient updates, e.g. aux-loss-free balancing biases
        self.step += 1
        for r in records:
            p.window.routing.add(r)
        self.steps_in_timer += 1
        self.step_seconds += time.perf_counter() - t_step
        p.window.loss_sum += step_loss
        p.window.aux_sum += step_aux
        p.window.steps += 1
        return StepStats(lr, grad_norm, x_last)

    # --- logging and validation

    def train_record(self, stats: StepStats) -> dict:
        """The logging record of the window since the last log step (and the console line)."""
        p, step = self.parts, self.step
        tok_s = self.steps_in_timer * self.tokens_per_step / self.step_seconds
        throughput = p.meter.measure(tok_s)  # perf/model_flops_per_s, and perf/mfu when there is a peak
        routing, self.last_loads = p.window.routing.summarize()
        record = {"train/loss": p.window.loss_sum / p.window.steps, "train/aux_loss": p.window.aux_sum / p.window.steps,
                  "train/lr": stats.lr, "perf/tokens_per_s": tok_s, **throughput,
                  "train/tokens": step * self.tokens_per_step, **routing,
                  **self.mtp_window.record(mtp_coef_at(self.tc, step))}
        if stats.grad_norm is not None:
            record["train/grad_norm"] = float(stats.grad_norm)
        record.update(self.dims.mean_dict(p.probe.overlap(stats.last_x)))  # train vs eval routing
        eta = (self.end_step - step) * self.step_seconds / self.steps_in_timer
        log.info("step %d/%d | loss %.4f | lr %.2e | %s tok/s | %s | imbalance %.2f | eta %s", step,
                 self.tc.max_steps, record["train/loss"], stats.lr, f"{tok_s:,.0f}", format_perf(throughput),
                 routing.get("moe/load_imbalance", float("nan")), _fmt_eta(eta))
        self.train_loss = record["train/loss"]
        p.window.reset()
        self.step_seconds, self.steps_in_timer = 0.0, 0
        return record

    def evaluate_and_log(self, stats: StepStats) -> None:
        """Logging and validation follow the intervals only: a stop (stop_after, a signal) adds no
        record, and the checkpoint carries the open logging window, so a resumed run logs what an
        uninterrupted one would."""
        tc, step, record, heatmap = self.tc, self.step, {}, None
        if step % tc.log_interval == 0 or step == tc.max_steps:
            record.update(self.train_record(stats))
        if step % tc.eval_interval == 0 or step == tc.max_steps:
            val_loss = self.validate()
            record.update({"val/loss": val_loss, "val/ppl": math.exp(min(val_loss, 50)),
                           **self.parts.probe.stability()})
            log.info("step %d | val loss %.4f | val ppl %.2f", step, val_loss, record["val/ppl"])
            if self.last_loads and self.dims.is_main:
                heatmap = save_load_heatmap(self.last_loads, self.run_dir / "plots" / "load_heatmap.png", step)
        if record:
            self.logger.log({"step": step, **record}, loads=self.last_loads if "train/loss" in record else None,
                            heatmap=heatmap)

    # --- the loop

    def stop_requested(self, signals: StopSignals, guard: PreemptionGuard) -> bool:
        """The end step, or a stop signal on any rank (they may get it at different steps)."""
        asked = float(signals.requested or guard.received)
        return self.step >= self.end_step or (self.dims.mean(asked) > 0 if self.dims.many else asked > 0)

    def run(self, signals: StopSignals, guard: PreemptionGuard, profiler=None) -> None:
        """The steps until the end step or a stop; `profiler.step()` after each (moe/train/profile.py)."""
        while self.step < self.end_step:
            stats = self.train_step()
            if stats is None:
                break
            self.evaluate_and_log(stats)
            fault_pause("step-end", self.step, self.run_dir, until=lambda: bool(signals.requested or guard.received))
            stopping = self.stop_requested(signals, guard)
            self.checkpoint_if_due(stopping)
            if profiler is not None:
                profiler.step()
            if stopping:
                break


def train(cfg: Config, run_dir: Path, job: Optional[JobInfo] = None) -> dict:
    """Train (or resume) according to `cfg`, writing into `run_dir` (or, on a resume, the resumed
    run's directory: see moe/train/run_dir.py); returns the summary. `job`: the launcher's overrides."""
    parts = setup_run(cfg, run_dir, job, Logger)  # `Logger` looked up here: tests substitute it
    trainer = Trainer(parts)
    if not parts.resumed:
        trainer.first_validation()
    trainer.model.train()
    t_start = time.perf_counter()
    # SIGINT/SIGTERM (StopSignals) and the cluster's preemption signal (PreemptionGuard: USR2 before a
    # SLURM time limit) both stop the run at the end of a step, with a checkpoint every rank writes.
    signals, guard = StopSignals(), PreemptionGuard()
    with signals, guard, profile_run(parts) as profiler:  # train.profile: torch.profiler windows
        trainer.run(signals, guard, profiler)
    summary = finish_summary(trainer, signals, guard, train_seconds=time.perf_counter() - t_start)
    parts.logger.close()
    parts.dims.close()
    guard.hand_over()  # in a submitit job: its requeue handler (rank 0 exits there); a no-op otherwise
    return summary
