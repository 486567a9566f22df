"""A Hydra callback for tests/cluster: make the cluster's preemption signal arrive in one job of a sweep.

Added to a launcher sweep with `+hydra.callbacks.preempt._target_=tests.cluster.preempt_callback.PreemptOnce
+hydra.callbacks.preempt.job_num=1 +hydra.callbacks.preempt.at_step=3 +hydra.callbacks.preempt.marker=PATH`.
Hydra calls `on_job_start` inside the job's processes; on the job's first attempt (no marker file
yet) its rank 0 sends itself the preemption signal while step `at_step` runs, as SLURM would
before a time limit. The other rank gets no signal: the ranks must agree by themselves."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from hydra.experimental.callback import Callback


class PreemptOnce(Callback):
    def __init__(self, job_num: int, at_step: int, marker: str) -> None:
        self.job_num, self.at_step, self.marker = int(job_num), int(at_step), Path(marker)

    def on_job_start(self, config, **kwargs) -> None:
        if config.hydra.job.num != self.job_num or self.marker.exists() or os.environ.get("RANK", "0") != "0":
            return
        import moe.train.loop as loop
        from moe.train.preemption import preemption_signal

        lr_at, at_step, marker = loop.lr_at, self.at_step, self.marker

        def lr_at_then_signal(step, *args, **kwargs):  # the loop asks for the lr of step `step + 1` first
            if step + 1 == at_step and not marker.exists():
                marker.write_text(f"preemption signal sent during step {at_step}\n")
                os.kill(os.getpid(), preemption_signal())
            return lr_at(step, *args, **kwargs)

        loop.lr_at = lr_at_then_signal
