"""One logging interface, several sinks: console, `metrics.jsonl`, and Weights & Biases.

The trainer calls `log(step, scalars, loads=...)`; every sink gets the same numbers.
The routing monitor (moe/routing/monitor.py) turns per-layer threshold crossings (dead experts, load
imbalance, collapse, a router not learning) into console warnings and W&B alerts.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional

from moe.config import Config, LoggerConfig, to_dict
from moe.jsonl import NONFINITE_KEY, dumps_record, read_records, split_nonfinite, write_records
from moe.routing.monitor import RoutingMonitor

log = logging.getLogger("moe")


class JsonlSink:
    """Append-only metrics file in strict JSON (`moe/jsonl.py`: non-finite values are written as
    null and listed under "nonfinite"). On resume, records after the resumed step are dropped (and
    a torn last line from a crash, with a warning) so the file reads as one uninterrupted run."""

    def __init__(self, path: Path, resume_step: Optional[int] = None):
        self.path = path
        if resume_step is not None and path.exists():
            write_records(path, read_records(path, max_step=resume_step))
        self.f = open(path, "a", buffering=1)
        self.warned: set[str] = set()

    def write(self, record: dict) -> None:
        _, bad = split_nonfinite(record)
        for key in sorted(set(bad) - self.warned):
            log.warning("step %s: %s is %s (written to %s as null, listed under %r; later ones are not repeated "
                        "here)", record.get("step"), key, bad[key], self.path.name, NONFINITE_KEY)
            self.warned.add(key)
        self.f.write(dumps_record(record) + "\n")

    def close(self) -> None:
        self.f.close()


SUMMARY_LIMIT = 40  # end-of-run summary lines W&B prints (its default, 10, showed only routing keys)


class WandbSink:
    def __init__(self, cfg: Config, run_dir: Path, resume_id: Optional[str]):
        import wandb

        self.wandb = wandb
        lc: LoggerConfig = cfg.logger
        mode = os.environ.get("WANDB_MODE") or lc.mode or "offline"
        # W&B prints the run summary at the end sorted by key and cut after a limit, so dozens of
        # per-layer routing keys pushed train/loss and val/loss off it: per-layer keys stay in the
        # charts but out of the summary, and the limit covers the remaining keys.
        self.run = wandb.init(project=lc.project, dir=str(run_dir), mode=mode, config=to_dict(cfg),
                              group=lc.group, tags=list(lc.tags) or None, name=lc.run_name,
                              id=resume_id, resume="allow" if resume_id else None,
                              settings=wandb.Settings(max_end_of_run_summary_metrics=SUMMARY_LIMIT))
        self.run.define_metric("moe/layer*", summary="none")
        self.run_id = self.run.id
        self.mode = mode
        self.lost: Optional[str] = None  # why W&B stopped answering (its service died), once it did

    @property
    def location(self) -> str:
        """Where the run is: its URL online, its folder (and how to upload it) offline."""
        if self.mode == "online" and getattr(self.run, "url", None):
            return self.run.url
        folder = Path(self.run.dir).parent  # run.dir is <run folder>/files
        return f"offline, upload with: wandb sync {folder}" if self.mode == "offline" else str(folder)

    def write(self, record: dict, loads=None, heatmap=None) -> None:
        data = dict(record)
        step = data.pop("step")
        if loads is not None:
            import numpy as np
            for i, load_E in enumerate(loads):
                # One bar per expert: the histogram's bins are the expert ids.
                data[f"moe/layer{i}/expert_load"] = self.wandb.Histogram(
                    np_histogram=(np.asarray(load_E), np.arange(len(load_E) + 1)))
        if heatmap is not None:
            data["moe/load_heatmap"] = self.wandb.Image(str(heatmap))
        if self.lost is None:
            self._guarded("log", lambda: self.run.log(data, step=step))

    def table(self, key: str, columns: list, rows: list, step: int) -> None:
        self.run.log({key: self.wandb.Table(columns=columns, data=rows)}, step=step)

    def alert(self, title: str, text: str) -> None:
        try:
            self.run.alert(title=title, text=text)
        except Exception as e:  # offline runs cannot send alerts; the console warning stands
            log.debug("wandb alert not sent: %s", e)

    def _guarded(self, what: str, call) -> None:
        """W&B's service process can die before the trainer (a job's SIGTERM reaches every process of
        the job): the run goes on without W&B (metrics.jsonl has every record), said once."""
        try:
            call()
        except Exception as e:  # noqa: BLE001 - ConnectionResetError, BrokenPipeError, wandb's own errors
            self.lost = f"{type(e).__name__}: {e}"
            log.warning("W&B %s failed (%s); its service is gone, so this run logs to metrics.jsonl only from here "
                        "(the W&B run %s resumes with the run)", what, self.lost, self.run_id)

    def close(self) -> None:
        if self.lost is None:
            self._guarded("finish", self.run.finish)


class Logger:
    def __init__(self, cfg: Config, run_dir: Path, resume_step: Optional[int] = None,
                 wandb_id: Optional[str] = None):
        self.jsonl = JsonlSink(run_dir / "metrics.jsonl", resume_step)
        self.wandb = WandbSink(cfg, run_dir, wandb_id) if cfg.logger.name == "wandb" else None
        self.monitor = RoutingMonitor(cfg.monitor, cfg.model.n_experts)
        self.alerts: list[str] = []  # routing alerts raised, for the closing summary

    @property
    def wandb_id(self) -> Optional[str]:
        return self.wandb.run_id if self.wandb else None

    @property
    def wandb_location(self) -> Optional[str]:
        return self.wandb.location if self.wandb else None

    def log(self, record: dict, loads=None, heatmap=None) -> None:
        self.jsonl.write(record)
        if self.wandb:
            self.wandb.write(record, loads, heatmap)
        for alert in self.monitor.check(record):
            log.warning("routing monitor: %s", alert.text)
            self.alerts.append(str(alert))
            if self.wandb:
                self.wandb.alert(f"moe-lab: {alert.name} (layer {alert.layer})", alert.text)

    def log_table(self, key: str, columns: list, rows: list, step: int) -> None:
        """A table for W&B alone (e.g. the profiler's top operators; the files in the run directory
        hold it for the other sinks)."""
        if self.wandb:
            self.wandb.table(key, columns, rows, step)

    def close(self) -> None:
        self.jsonl.close()
        if self.wandb:
            self.wandb.close()


def save_load_heatmap(loads: list[list[float]], path: Path, step: int) -> Path:
    """Layers x experts heatmap of the fraction of assignments each expert received."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4, 0.4 * len(loads[0]) + 2), max(2.5, 0.4 * len(loads) + 1.5)))
    im = ax.imshow(loads, aspect="auto", cmap="viridis")
    ax.set_xlabel("expert")
    ax.set_ylabel("MoE layer")
    ax.set_title(f"expert load (fraction of assignments), step {step}")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


class NullLogger:
    """The logger of ranks other than 0: rank 0 alone writes metrics.jsonl, W&B and the console."""

    wandb_id = None
    wandb_location = None
    alerts: list = []

    def log(self, record: dict, loads=None, heatmap=None) -> None:
        pass

    def log_table(self, key: str, columns: list, rows: list, step: int) -> None:
        pass

    def close(self) -> None:
        pass
