"""Profiling shared by the trainer and the engine: the named ranges of the model's stages
(`stage`, free when no profiler runs), and `StepProfiler`, torch.profiler over a loop's steps
writing Chrome traces, a memory record and a summary of the top operators and the stages
(docs/guides/profiling.md)."""

from moe.profiling.ranges import STAGES, stage
from moe.profiling.session import ProfileWindow, StepProfiler, WindowReport

__all__ = ["STAGES", "ProfileWindow", "StepProfiler", "WindowReport", "stage"]
