"""Where a run's results are: the run directory when it starts, and a closing summary (losses,
steps, time, checkpoint, W&B run, routing alerts) when it ends, with every logger (`logger=none`
too), in the console and `train.log`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional


def _fmt_time(seconds: float) -> str:
    seconds = int(round(max(0.0, seconds)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _fmt_loss(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def start_message(run_dir: Path, resumed_from: Optional[Path] = None) -> str:
    where = f"run directory: {Path(run_dir).resolve()}"
    return where + (f" (resuming {resumed_from})" if resumed_from else "")


def closing_summary(summary: dict) -> str:
    """The block printed when a run ends; `summary` is what `train` returns (and writes to summary.json)."""
    run_dir = Path(summary["run_dir"])
    stopped = " (stopped early: train.stop_after)" if summary.get("stopped_early") else ""
    lines = [f"run finished: step {summary['step']}/{summary['max_steps']}{stopped} in "
             f"{_fmt_time(summary['wall_seconds'])} (training loop {_fmt_time(summary['train_seconds'])})"]
    initial = summary.get("initial_val_loss")
    lines.append(f"  train loss {_fmt_loss(summary.get('final_train_loss'))} | val loss "
                 f"{_fmt_loss(summary.get('final_val_loss'))}" + (f" (step 0: {initial:.4f})" if initial else ""))
    checkpoints = summary.get("checkpoints") or []
    lines.append(f"  checkpoint  {checkpoints[-1] if checkpoints else 'none written'}")
    lines.append(f"  metrics     {run_dir / 'metrics.jsonl'}, {run_dir / 'summary.json'}")
    wandb = summary.get("wandb")
    lines.append(f"  W&B         {wandb or 'off (logger=none)'}")
    alerts = summary.get("routing_alerts") or []
    lines.append("  routing     " + (f"{len(alerts)} alert(s): " + "; ".join(alerts) if alerts else "no alerts"))
    lines.append(f"  run dir     {run_dir.resolve()}")
    return "\n".join(lines)
