"""Preemption-safe stops: SIGINT (Ctrl-C) and SIGTERM (what a cluster sends before preempting)
ask the training loop to stop after the current optimizer step, with a checkpoint and
`summary.json`; a second SIGINT exits at once (KeyboardInterrupt, which `train.py` turns into one
line and exit code 130).

The handlers only set a flag, so a signal never interrupts a step, a validation or a checkpoint
write half-way; the loop reads the flag between steps (`StopSignals.requested`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Optional

HANDLED = (signal.SIGINT, signal.SIGTERM)


def notice(message: str) -> None:
    """Tell the person at the console, from inside a signal handler. Not `logging`: the handler runs
    between two bytecodes of the main thread, which may be inside the same handler's `flush()`,
    and a buffered stream entered twice raises `RuntimeError: reentrant call` (seen in CI). One
    unbuffered `os.write` to the stderr descriptor takes no Python-level lock. The loop logs the
    stop itself (`stopped by SIGx after step N`) to the console and train.log once it acts on it."""
    try:
        os.write(sys.stderr.fileno(), f"[moe][WARNING] - {message}\n".encode())
    except (OSError, ValueError, AttributeError):
        pass  # no usable stderr (closed, or replaced by an object without a descriptor)


class StopSignals:
    """Context manager installing the handlers (main thread only: Python delivers signals there)."""

    def __init__(self):
        self.signum: Optional[int] = None
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> Optional[str]:
        return signal.Signals(self.signum).name if self.signum is not None else None

    def exit_code(self, zero: bool = False) -> int:
        """0 when configured, else the shell convention 128 + signal number (130 SIGINT, 143 SIGTERM)."""
        return 0 if zero or self.signum is None else 128 + self.signum

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt  # the second Ctrl-C: exit now, without a checkpoint
            return
        self.signum = signum
        notice(f"received {signal.Signals(signum).name}: finishing the current step, then writing a "
               "checkpoint (press Ctrl-C again to exit at once, without it)")

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for s in HANDLED:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()
