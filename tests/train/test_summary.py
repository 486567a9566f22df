"""What a run prints about where its results are and why it stopped (moe/train/summary.py)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import moe.train.loop as loop
from moe.train import train
from moe.train.summary import closing_summary, start_message, stop_reason
from tests.train.runs import composed_cfg, read_metrics


def test_start_message_and_closing_summary(tmp_path):
    assert start_message(tmp_path) == f"run directory: {tmp_path.resolve()}"
    ckpt = tmp_path / "checkpoints" / "step_0000300.pt"
    summary = {"run_dir": str(tmp_path), "step": 300, "max_steps": 300, "wall_seconds": 92.4, "train_seconds": 70.2,
               "final_train_loss": 4.73124, "final_val_loss": 4.80339, "initial_val_loss": 8.41211,
               "checkpoints": [str(tmp_path / "checkpoints" / "step_0000200.pt"), str(ckpt)], "wandb": None,
               "routing_alerts": ["step 70: dead_experts (layer 2)"], "stopped_early": False}
    assert closing_summary(summary).splitlines() == [
        "run finished: step 300/300 in 0:01:32 (training loop 0:01:10)",
        "  train loss 4.7312 | val loss 4.8034 (step 0: 8.4121)",
        f"  checkpoint  {ckpt}",
        f"  metrics     {Path(tmp_path) / 'metrics.jsonl'}, {Path(tmp_path) / 'summary.json'}",
        "  W&B         off (logger=none)",
        "  routing     1 alert(s): step 70: dead_experts (layer 2)",
        f"  run dir     {tmp_path.resolve()}"]
    stopped = closing_summary({**summary, "step": 100, "stopped_early": True, "checkpoints": [], "wandb": "x",
                               "routing_alerts": [], "final_train_loss": None})
    assert "step 100/300 (stopped early: train.stop_after)" in stopped and "train loss n/a" in stopped
    assert "checkpoint  none written" in stopped and "W&B         x" in stopped and "routing     no alerts" in stopped


def test_the_stop_reason_names_what_ended_the_run():
    assert stop_reason(10, 10, None, None, False, None) == "train.max_steps reached"
    assert stop_reason(10, 10, 10, "SIGTERM", False, None) == "train.max_steps reached"  # the last step anyway
    assert stop_reason(3, 10, 3, None, False, None) == "train.stop_after=3"
    assert stop_reason(6, 10, None, "SIGINT", False, None) == "SIGINT"
    assert stop_reason(6, 10, None, None, True, None) == "preemption signal"
    nan = {"step": 7, "what": "loss", "value": "nan"}
    assert stop_reason(6, 10, None, None, False, nan) == "non-finite loss at step 7 (train.stop_on_nan)"


def test_the_closing_summary_says_why_and_when_the_val_loss_was_measured(tmp_path):
    base = {"run_dir": str(tmp_path), "max_steps": 300, "wall_seconds": 10.0, "train_seconds": 8.0,
            "final_train_loss": 5.0, "initial_val_loss": 8.0, "checkpoints": [], "wandb": None, "routing_alerts": []}
    done = closing_summary({**base, "step": 300, "stopped_early": False, "stop_reason": "train.max_steps reached",
                            "final_val_loss": 4.5, "final_val_step": 300}).splitlines()
    assert done[0] == "run finished: step 300/300 in 0:00:10 (training loop 0:00:08): train.max_steps reached"
    assert done[1] == "  train loss 5.0000 | val loss 4.5000 at step 300 (step 0: 8.0000)"
    stopped = closing_summary({**base, "step": 42, "stopped_early": True, "stop_reason": "SIGTERM",
                               "final_val_loss": 8.0, "final_val_step": 0}).splitlines()
    assert stopped[0].startswith("run finished: step 42/300 (stopped early: SIGTERM) in ")
    assert stopped[1] == "  train loss 5.0000 | val loss 8.0000 at step 0"  # not presented as the final state


def test_a_signal_stop_reports_the_signal_and_the_last_validation_step(reference, tmp_path, monkeypatch):
    """SIGTERM arrives during step 6 (validation every 4 steps): the summary names SIGTERM and the
    val loss of step 4 with its step; an uninterrupted run names max_steps and its last step."""
    lr_at = loop.lr_at

    def lr_then_signal(step, *a):
        if step == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        return lr_at(step, *a)
    monkeypatch.setattr(loop, "lr_at", lr_then_signal)
    run = tmp_path / "run"
    s = train(composed_cfg(reference.cache), run)
    val_4 = [r["val/loss"] for r in read_metrics(reference.run) if r["step"] == 4][0]
    assert (s["step"], s["stop_reason"], s["final_val_step"], s["final_val_loss"]) == (6, "SIGTERM", 4, val_4)
    assert json.loads((run / "summary.json").read_text())["stop_reason"] == "SIGTERM"
    full = json.loads((reference.run / "summary.json").read_text())
    assert (full["stop_reason"], full["final_val_step"]) == ("train.max_steps reached", 10)
