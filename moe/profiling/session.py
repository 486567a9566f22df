"""`StepProfiler`: torch.profiler over the steps of a loop (the trainer's, the engine's).

The window follows torch.profiler's schedule: `wait` steps skipped, `warmup` steps run under
the profiler but not kept (its start-up cost lands there), `active` steps recorded, the cycle
done `repeat` times (0: until the loop ends). Each recorded window writes into `out_dir`:

    <name>_steps<a>-<b>.trace.json     the Chrome trace (chrome://tracing, ui.perfetto.dev)
    <name>_steps<a>-<b>.memory.pickle  CUDA: the allocator's history and snapshot
                                       (torch.cuda.memory._record_memory_history; pytorch.org/memory_viz)
    <name>_steps<a>-<b>.memory.json    CPU: the operators that allocated the most (profile_memory=True)
    <summary file>                     every window so far: stage totals, top operators, the files

Steps are numbered from `first_step + 1` (the trainer's step counter after the step). A loop
that ends inside a window still writes it (fewer steps). Once the last window is written the
profiler is stopped, so the rest of the loop runs without it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch
from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule

from moe.jsonl import write_json
from moe.profiling.summary import memory_operators, stage_totals, top_operators

log = logging.getLogger("moe")

RECORDING = (ProfilerAction.WARMUP, ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
MEMORY_HISTORY_ENTRIES = 100_000  # allocator events kept per window (the snapshot's ring buffer)


@dataclass(frozen=True)
class ProfileWindow:
    """torch.profiler.schedule's terms: steps skipped, warmed up, recorded; cycles (0: no end)."""

    wait: int = 0
    warmup: int = 1
    active: int = 3
    repeat: int = 1

    @property
    def cycle(self) -> int:
        return self.wait + self.warmup + self.active

    @property
    def last_step(self) -> Optional[int]:
        """The last recorded step counted from the loop's start (None: repeats until the end)."""
        return self.repeat * self.cycle if self.repeat else None


@dataclass
class WindowReport:
    """One recorded window: what was written and what it says (the summary file's entries)."""

    rank: int
    steps: tuple[int, int]
    trace: str
    memory: Optional[str]
    device: str
    stages: dict
    top_ops: list
    memory_ops: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"rank": self.rank, "steps": list(self.steps), "device": self.device, "trace": self.trace,
                "memory": self.memory, "stages": self.stages, "top_ops": self.top_ops, "memory_ops": self.memory_ops}


class StepProfiler:
    """`with StepProfiler(...) as p: for ...: step(); p.step()`; see the module docstring.
    `on_window(report)` is called after each window is written (console, W&B)."""

    def __init__(self, out_dir: Path, window: ProfileWindow, device: torch.device, *, name: str = "rank0",
                 rank: int = 0, summary_file: str = "summary.json", first_step: int = 0, top_ops: int = 15,
                 memory: bool = True, on_window: Optional[Callable[[WindowReport], None]] = None):
        self.out_dir, self.window, self.device, self.name, self.rank = Path(out_dir), window, device, name, rank
        self.summary_path = self.out_dir / summary_file
        self.first_step, self.n_top, self.memory, self.on_window = first_step, top_ops, memory, on_window
        self.reports: list[WindowReport] = []
        self.prof: Optional[profile] = None
        self.window_start: Optional[int] = None  # the first step of the window being recorded
        self.history_on = False  # CUDA allocator history being recorded

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def __enter__(self) -> "StepProfiler":
        self.out_dir.mkdir(parents=True, exist_ok=True)
        w = self.window
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.prof = profile(activities=activities, schedule=schedule(wait=w.wait, warmup=w.warmup, active=w.active,
                                                                     repeat=w.repeat),
                            on_trace_ready=self._save, record_shapes=True, profile_memory=self.memory)
        self.prof.__enter__()
        self._follow_schedule()
        return self

    def step(self) -> None:
        """The end of one loop step."""
        if self.prof is None:
            return
        self.prof.step()
        self._follow_schedule()
        if self.window.repeat and len(self.reports) >= self.window.repeat:
            self._stop()  # every window written: the rest of the loop runs unprofiled

    def __exit__(self, *exc) -> None:
        self._stop()

    def _stop(self) -> None:
        if self.prof is not None:
            prof, self.prof = self.prof, None
            prof.__exit__(None, None, None)  # inside a window: writes it (fewer steps)
        self._memory_history(False)

    @property
    def steps_done(self) -> int:
        return self.first_step + (self.prof.step_num if self.prof is not None else 0)

    def _follow_schedule(self) -> None:
        """Note where a window starts; on CUDA, record the allocator's history through it."""
        action = self.prof.current_action
        if action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE) and self.window_start is None:
            self.window_start = self.steps_done + 1
        self._memory_history(action in RECORDING)

    def _memory_history(self, on: bool) -> None:
        if not (self.cuda and self.memory) or on == self.history_on:
            return
        if on:
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
        else:
            torch.cuda.memory._record_memory_history(enabled=None)
        self.history_on = on

    def _save(self, prof: profile) -> None:
        """torch.profiler's on_trace_ready: one window recorded."""
        last = self.first_step + prof.step_num
        first = self.window_start if self.window_start is not None else last
        stem = f"{self.name}_steps{first}-{last}"
        trace = self.out_dir / f"{stem}.trace.json"
        prof.export_chrome_trace(str(trace))
        averages = prof.key_averages()
        stages = stage_totals(prof.events(), last - first + 1)
        report = WindowReport(self.rank, (first, last), trace.name, None, self.device.type, stages,
                              top_operators(averages, self.n_top, self.cuda))
        if self.memory:
            report.memory_ops = memory_operators(averages, self.n_top)
            report.memory = self._save_memory(stem, report.memory_ops)
        self.reports.append(report)
        self.window_start = None
        write_json(self.summary_path, {"windows": [r.as_dict() for r in self.reports]})
        if self.on_window is not None:
            self.on_window(report)

    def _save_memory(self, stem: str, memory_ops: list) -> str:
        if self.cuda:
            path = self.out_dir / f"{stem}.memory.pickle"
            torch.cuda.memory._dump_snapshot(str(path))
            self._memory_history(False)  # the next window starts a fresh history
        else:
            path = self.out_dir / f"{stem}.memory.json"
            write_json(path, {"device": "cpu", "note": "per operator: memory it allocated minus what it freed "
                                                       "(torch.profiler profile_memory=True)", "operators": memory_ops})
        return path.name
