"""A Hydra callback for the real-SLURM requeue tests: hold chosen jobs of a sweep at a point of their
first attempt, say so in a marker file, and wait there for the test's signal.

`+hydra.callbacks.pause._target_=tests.cluster.pause_callback.PauseFirstAttempt
+hydra.callbacks.pause.points={1:early,2:late} +hydra.callbacks.pause.marker_dir=PATH`:
`early` holds job 1 after its step-0 validation (metrics.jsonl written, no checkpoint yet, the
trainer's own signal handlers not yet installed: the signal meets submitit's); `late` holds job 2 at
the end of step 5 (after the checkpoint of step 4; the trainer's handlers stop it with a checkpoint
of step 5). `<marker_dir>/paused_<num>` appears when a job is held; an attempt with that file
present is a requeued one and runs through."""

from __future__ import annotations

import os
import time
from pathlib import Path

from hydra.experimental.callback import Callback

LATE_STEP = 5


class PauseFirstAttempt(Callback):
    def __init__(self, points: dict, marker_dir: str) -> None:
        self.points = {int(k): str(v) for k, v in dict(points).items()}
        self.marker_dir = Path(marker_dir)

    def on_job_start(self, config, **kwargs) -> None:
        num = int(config.hydra.job.num)
        marker = self.marker_dir / f"paused_{num}"
        if num not in self.points or marker.exists() or os.environ.get("RANK", "0") != "0":
            return
        import moe.train.loop as loop

        if self.points[num] == "early":
            first_validation = loop.Trainer.first_validation

            def validate_then_hold(trainer):
                first_validation(trainer)
                marker.write_text("held after the step-0 validation\n")
                deadline = time.monotonic() + 600
                while time.monotonic() < deadline:  # until the signal ends this process
                    time.sleep(0.1)

            loop.Trainer.first_validation = validate_then_hold
        else:
            fault_pause = loop.fault_pause

            def hold_at_late_step(point, step, where, until=lambda: False):
                if point == "step-end" and step == LATE_STEP:
                    marker.write_text(f"held at the end of step {LATE_STEP}\n")
                    while not until():
                        time.sleep(0.05)
                fault_pause(point, step, where, until)

            loop.fault_pause = hold_at_late_step
