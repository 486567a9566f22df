"""One logging interface, several sinks: console, `metrics.jsonl`, and Weights & Biases.

The trainer calls `log(step, scalars, loads=...)`; every sink gets the same numbers.
`RoutingMonitor` turns threshold crossings (router not learning, load collapse) into
console warnings and W&B alerts.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Optional

from moe.config import Config, LoggerConfig, MonitorConfig, to_dict

log = logging.getLogger("moe")


class JsonlSink:
    """Append-only metrics file; on resume, records after the resumed step are dropped so the
    file reads as one uninterrupted run."""

    def __init__(self, path: Path, resume_step: Optional[int] = None):
        self.path = path
        if resume_step is not None and path.exists():
            kept = [ln for ln in path.read_text().splitlines()
                    if ln.strip() and json.loads(ln).get("step", 0) <= resume_step]
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(ln + "\n" for ln in kept))
            os.replace(tmp, path)
        elif resume_step is None and path.exists():
            path.unlink()  # a fresh run in a reused directory starts a fresh file
        self.f = open(path, "a", buffering=1)

    def write(self, record: dict) -> None:
        self.f.write(json.dumps(record, allow_nan=True) + "\n")

    def close(self) -> None:
        self.f.close()


class WandbSink:
    def __init__(self, cfg: Config, run_dir: Path, resume_id: Optional[str]):
        import wandb

        self.wandb = wandb
        lc: LoggerConfig = cfg.logger
        mode = os.environ.get("WANDB_MODE") or lc.mode or "offline"
        self.run = wandb.init(project=lc.project, dir=str(run_dir), mode=mode, config=to_dict(cfg),
                              group=lc.group, tags=list(lc.tags) or None, name=lc.run_name,
                              id=resume_id, resume="allow" if resume_id else None)
        self.run_id = self.run.id

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
        self.run.log(data, step=step)

    def alert(self, title: str, text: str) -> None:
        try:
            self.run.alert(title=title, text=text)
        except Exception as e:  # offline runs cannot send alerts; the console warning stands
            log.debug("wandb alert not sent: %s", e)

    def close(self) -> None:
        self.run.finish()


class RoutingMonitor:
    """Warn when normalised token entropy stays above `token_entropy_high` (the router is
    not learning to discriminate) or load entropy stays below `load_entropy_low` (collapse)
    for `patience` consecutive log steps."""

    def __init__(self, cfg: MonitorConfig):
        self.cfg = cfg
        self.streak = {"token_entropy_high": 0, "load_entropy_low": 0}

    def check(self, scalars: dict) -> list[tuple[str, str]]:
        alerts = []
        if scalars.get("step", 0) < self.cfg.start_step:
            return alerts
        tests = {
            "token_entropy_high": ("moe/token_entropy_norm", lambda v: v > self.cfg.token_entropy_high,
                                   f"normalised routing entropy above {self.cfg.token_entropy_high}: the router is not learning"),
            "load_entropy_low": ("moe/load_entropy_norm", lambda v: v < self.cfg.load_entropy_low,
                                 f"normalised load entropy below {self.cfg.load_entropy_low}: expert collapse"),
        }
        for name, (key, bad, text) in tests.items():
            v = scalars.get(key)
            if v is None or not math.isfinite(v):
                continue
            self.streak[name] = self.streak[name] + 1 if bad(v) else 0
            if self.streak[name] == self.cfg.patience:
                alerts.append((name, f"{text} ({key}={v:.3f} for {self.cfg.patience} log steps)"))
        return alerts


class Logger:
    def __init__(self, cfg: Config, run_dir: Path, resume_step: Optional[int] = None,
                 wandb_id: Optional[str] = None):
        self.jsonl = JsonlSink(run_dir / "metrics.jsonl", resume_step)
        self.wandb = WandbSink(cfg, run_dir, wandb_id) if cfg.logger.name == "wandb" else None
        self.monitor = RoutingMonitor(cfg.monitor)

    @property
    def wandb_id(self) -> Optional[str]:
        return self.wandb.run_id if self.wandb else None

    def log(self, record: dict, loads=None, heatmap=None) -> None:
        self.jsonl.write(record)
        if self.wandb:
            self.wandb.write(record, loads, heatmap)
        for name, text in self.monitor.check(record):
            log.warning("routing monitor: %s", text)
            if self.wandb:
                self.wandb.alert(f"moe-lab: {name}", text)

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
