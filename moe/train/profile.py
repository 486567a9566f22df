"""`train.profile.enabled=true`: torch.profiler over training steps (moe/profiling/ does the
recording; this module chooses where it goes and who is told).

Every rank records its own windows into `<run dir>/profile/` (`rank<r>_steps<a>-<b>.trace.json`,
its memory record, and `summary.json` on rank 0, `summary_rank<r>.json` on the others). Rank 0
prints each window's stage times and top operators, logs the stage times as
`profile/<stage>_cpu_ms` (and `_device_ms` on CUDA; ms per recorded step, metrics.jsonl and W&B)
and the top operators as a W&B table (`profile/top_ops`).
"""

from __future__ import annotations

import contextlib
import logging

from moe.config import Config
from moe.profiling import ProfileWindow, StepProfiler, WindowReport
from moe.profiling.summary import console_text

log = logging.getLogger("moe")

TOP_OP_COLUMNS = ["name", "calls", "self_cpu_ms", "cpu_ms", "self_device_ms", "device_ms"]


class _NoProfiler:
    """The profiler of a run without `train.profile.enabled`: `step` does nothing."""

    def step(self) -> None:
        pass


def window_of(cfg: Config) -> ProfileWindow:
    p = cfg.train.profile
    return ProfileWindow(wait=p.wait, warmup=p.warmup, active=p.active, repeat=p.repeat)


def _reporter(logger):
    def report(window: WindowReport) -> None:
        log.info("%s", console_text(window.as_dict()))
        record = {f"profile/{name}_cpu_ms": s["cpu_ms_per_step"] for name, s in window.stages.items()}
        if window.device == "cuda":
            record.update({f"profile/{name}_device_ms": s["device_ms_per_step"] for name, s in window.stages.items()})
        logger.log({"step": window.steps[1], **record})
        logger.log_table("profile/top_ops", TOP_OP_COLUMNS, [[op[c] for c in TOP_OP_COLUMNS] for op in window.top_ops],
                         step=window.steps[1])
    return report


def profile_run(parts):
    """The run's profiler (a context manager; `.step()` after each training step), or one that
    does nothing when profiling is off. `parts`: what `setup_run` built (moe/train/setup.py)."""
    p, tc, dims = parts.cfg.train.profile, parts.cfg.train, parts.dims
    if not p.enabled:
        return contextlib.nullcontext(_NoProfiler())
    window, rank = window_of(parts.cfg), dims.rank
    if window.last_step is not None and parts.step + window.last_step > tc.max_steps and dims.is_main:
        log.warning("train.profile: resumed at step %d, the window ends at step %d, after train.max_steps=%d: the "
                    "last window is cut short", parts.step, parts.step + window.last_step, tc.max_steps)
    return StepProfiler(parts.run_dir / "profile", window, parts.device, name=f"rank{rank}", rank=rank,
                        summary_file="summary.json" if dims.is_main else f"summary_rank{rank}.json",
                        first_step=parts.step, top_ops=p.top_ops, memory=p.memory,
                        on_window=_reporter(parts.logger) if dims.is_main else None)
