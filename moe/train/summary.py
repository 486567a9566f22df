"""Where a run's results are: the run directory when it starts, and a closing summary (why it
stopped, losses with the step of the last validation, time, checkpoint, W&B run, routing alerts)
when it ends, with every logger (`logger=none` too), in the console, `train.log` and `summary.json`."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Optional

from moe.checkpoint import latest_checkpoint, list_checkpoints
from moe.jsonl import write_json

log = logging.getLogger("moe")


def _fmt_time(seconds: float) -> str:
    seconds = int(round(max(0.0, seconds)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _fmt_loss(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def start_message(run_dir: Path, resumed_from: Optional[Path] = None) -> str:
    where = f"run directory: {Path(run_dir).resolve()}"
    return where + (f" (resuming {resumed_from})" if resumed_from else "")


def stop_reason(step: int, max_steps: int, stop_after: Optional[int], signal: Optional[str], preempted: bool | str,
                nonfinite: Optional[dict]) -> str:
    """Why the loop ended, in the words of the option or event that ended it (`preempted`: the
    preemption signal's name, or True when it is not known)."""
    if step >= max_steps:
        return "train.max_steps reached"
    if nonfinite:
        return f"non-finite {nonfinite['what']} at step {nonfinite['step']} (train.stop_on_nan)"
    if signal:
        return signal
    if preempted:
        return f"{preempted} (preemption or time limit)" if isinstance(preempted, str) else "preemption signal"
    return f"train.stop_after={stop_after}" if stop_after else "stopped"


def closing_summary(summary: dict) -> str:
    """The block printed when a run ends; `summary` is what `train` returns (and writes to summary.json)."""
    run_dir = Path(summary["run_dir"])
    reason = summary.get("stop_reason") or ("train.stop_after" if summary.get("stopped_early") else None)
    stopped = f" (stopped early: {reason})" if summary.get("stopped_early") else ""
    done = f": {reason}" if reason and not summary.get("stopped_early") else ""
    lines = [f"run finished: step {summary['step']}/{summary['max_steps']}{stopped} in "
             f"{_fmt_time(summary['wall_seconds'])} (training loop {_fmt_time(summary['train_seconds'])}){done}"]
    initial, val_step = summary.get("initial_val_loss"), summary.get("final_val_step")
    lines.append(f"  train loss {_fmt_loss(summary.get('final_train_loss'))} | val loss "
                 f"{_fmt_loss(summary.get('final_val_loss'))}" + (f" at step {val_step}" if val_step is not None else "")
                 + (f" (step 0: {initial:.4f})" if initial and val_step != 0 else ""))
    checkpoints = summary.get("checkpoints") or []
    lines.append(f"  checkpoint  {checkpoints[-1] if checkpoints else 'none written'}")
    lines.append(f"  metrics     {run_dir / 'metrics.jsonl'}, {run_dir / 'summary.json'}")
    wandb = summary.get("wandb")
    lines.append(f"  W&B         {wandb or 'off (logger=none)'}")
    alerts = summary.get("routing_alerts") or []
    lines.append("  routing     " + (f"{len(alerts)} alert(s): " + "; ".join(alerts) if alerts else "no alerts"))
    lines.append(f"  run dir     {run_dir.resolve()}")
    return "\n".join(lines)


def finish_summary(trainer, signals, guard, train_seconds: float) -> dict:
    """The run's summary (returned by `train`, written to `summary.json` and printed by rank 0)
    from the trainer's end state and the stop signals; logs how to continue after a stop."""
    tc, step, run_dir = trainer.tc, trainer.step, trainer.run_dir
    summary = trainer.parts.summary
    summary.update({"step": step, "max_steps": tc.max_steps, "final_train_loss": trainer.train_loss,
                    "final_val_loss": trainer.val_loss, "final_val_step": trainer.val_step,
                    "train_seconds": train_seconds, "wall_seconds": time.perf_counter() - trainer.parts.t_wall,
                    "stopped_early": step < tc.max_steps,
                    "stop_reason": stop_reason(step, tc.max_steps, tc.stop_after, signals.name,
                                               guard.received and guard.name, trainer.nonfinite),
                    "checkpoints": [str(p) for p in list_checkpoints(run_dir)], "wandb": trainer.logger.wandb_location,
                    "routing_alerts": trainer.logger.alerts})
    if trainer.nonfinite:
        summary["stopped_nonfinite"] = trainer.nonfinite
    summary["preempted"] = guard.received
    if guard.received:
        log.warning("stopped at step %d for the preemption signal; checkpoint written", step)
    if signals.requested:
        summary.update({"signal": signals.name, "exit_code": signals.exit_code(tc.exit_zero_on_signal)})
        if os.environ.get("SUBMITIT_EXECUTOR") == "slurm":  # a sweep job on SLURM (moe/cluster/): it requeues itself
            log.warning("stopped by %s after step %d with checkpoint %s; SLURM requeues a preempted job and it "
                        "resumes from this checkpoint by itself", signals.name, step, latest_checkpoint(run_dir))
        else:
            log.warning("stopped by %s after step %d with checkpoint %s; to continue, run the same command with "
                        "train.resume=%s", signals.name, step, latest_checkpoint(run_dir), run_dir)
    if trainer.dims.is_main:
        write_json(run_dir / "summary.json", summary)
        log.info(closing_summary(summary))
    return summary
