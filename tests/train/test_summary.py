"""What a run prints about where its results are (moe/train/summary.py)."""

from __future__ import annotations

from pathlib import Path

from moe.train.summary import closing_summary, start_message


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
