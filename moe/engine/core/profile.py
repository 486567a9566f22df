"""The engine's `profile=` option: torch.profiler over `steps` model steps (moe/profiling/ does
the recording). Steps are the engine steps that ran the model (an idle server's empty steps do
not count), numbered from 1. The window is written once recorded (`<dir>/engine_steps<a>-<b>.trace.json`,
its memory record, `<dir>/summary.json`) and the profiler stopped; `finish` writes a window the
engine stopped inside of (fewer steps), e.g. when the server shuts down.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Optional

import torch

from moe.engine.config import EngineProfile
from moe.profiling import ProfileWindow, StepProfiler, WindowReport
from moe.profiling.summary import console_text

logger = logging.getLogger(__name__)
_NO_PROFILE = contextlib.nullcontext()  # stateless and reentrant: one instance serves every step


def _report(window: WindowReport) -> None:
    logger.info("%s", console_text(window.as_dict()))


class EngineProfiler:
    """`with profiler.step(): <one model step>`; does nothing without a `profile` option or once done."""

    def __init__(self, options: Optional[EngineProfile], device: torch.device):
        self.options, self.device = options, device
        self.active: Optional[StepProfiler] = None
        self.done = options is None

    @property
    def reports(self) -> list[WindowReport]:
        return self.active.reports if self.active is not None else []

    def step(self):
        """The context of one model step: a shared no-op unless profiling."""
        return _NO_PROFILE if self.done else self._profiled_step()

    @contextlib.contextmanager
    def _profiled_step(self):
        if self.active is None:
            o = self.options
            # The last skipped step is the warm-up (the profiler's own start-up cost lands there).
            window = ProfileWindow(wait=max(o.skip - 1, 0), warmup=min(o.skip, 1), active=o.steps, repeat=1)
            self.active = StepProfiler(Path(o.dir), window, self.device, name="engine", top_ops=o.top_ops,
                                       memory=o.memory, on_window=_report).__enter__()
        yield
        self.active.step()
        if self.active.reports:
            self.finish()

    def finish(self) -> None:
        """Stop profiling; a window being recorded is written with the steps it has."""
        if self.active is not None and not self.done:
            self.active.__exit__(None, None, None)
        self.done = True
