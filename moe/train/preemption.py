"""Stop at a step boundary, checkpointed, when the cluster announces a preemption or the time limit.

SLURM sends every process of a job a signal shortly before it takes the job away (submitit asks for
USR2 `signal_delay_s` before the time limit; `SUBMITIT_PREEMPT_SIGNAL` names another). submitit's
own handler, in the job's rank 0, would then checkpoint the job's callable and requeue it at
once, from inside whatever the process was doing, mid-step. Instead, while the trainer runs, the
`PreemptionGuard` only records the signal. At the end of every step the ranks agree whether any of
them got it (they may get it at different steps), all save that step's checkpoint together, the
trainer returns, and `hand_over` then passes the signal to the handler that was installed before
(submitit's: requeue the job, which resumes with `train.resume=auto`). Without such a handler the
signal's default action follows the checkpoint, as it would have without the guard.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Optional

from moe.train.signals import notice


def preemption_signal() -> signal.Signals:
    """The signal submitit's jobs receive before a preemption or the time limit (submitit's rule)."""
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
    sig = getattr(signal, f"SIG{name}", None)
    if sig is None:
        raise ValueError(f"SUBMITIT_PREEMPT_SIGNAL={name!r} names no signal (e.g. USR2)")
    return sig


class PreemptionGuard:
    """Use as `with PreemptionGuard() as guard:` around the training; `guard.stop_requested(dims)` at
    the end of each step (a collective: every rank calls it); `guard.hand_over()` after leaving it
    when the training stopped for the signal."""

    def __init__(self, signum: Optional[int] = None):
        self.signum = signum if signum is not None else preemption_signal()
        self.received = False
        self.previous = None
        self.installed = False

    def __enter__(self) -> "PreemptionGuard":
        # Signal handlers can only be installed from the main thread (a trainer run from another
        # thread, e.g. in a notebook helper, simply has no guard).
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(self.signum, self._record)
            self.installed = True
        return self

    def __exit__(self, *exc) -> None:
        if self.installed:
            signal.signal(self.signum, self.previous)
            self.installed = False

    def _record(self, signum, frame) -> None:
        if not self.received:
            notice(f"received {signal.Signals(signum).name} (preemption or time limit): "
                   "checkpointing at the end of this step")
        self.received = True

    @property
    def name(self) -> str:
        """The signal's name (SIGUSR2), for the run's summary."""
        return signal.Signals(self.signum).name

    def stop_requested(self, dims) -> bool:
        """True on every rank once any rank received the signal (one all-reduce with several processes)."""
        return dims.mean(1.0 if self.received else 0.0) > 0.0

    def hand_over(self) -> None:
        """Deliver the recorded signal to the handler that was there before the guard (after `__exit__`)."""
        if not self.received:
            return
        previous = self.previous
        if callable(previous):
            previous(self.signum, None)  # submitit: checkpoint + requeue on rank 0 (which exits), return elsewhere
        elif previous == signal.SIG_DFL:
            signal.raise_signal(self.signum)
