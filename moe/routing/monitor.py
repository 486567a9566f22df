"""The routing monitor: per-layer alerts when routing goes wrong, calibrated on recorded runs.

Every log step the trainer's routing scalars (`moe/layer{i}/...`, moe/routing/metrics.py) go through
`RoutingMonitor.check`. A check fires when one layer stays beyond its threshold for
`monitor.patience` consecutive log steps after `monitor.start_step`, once per episode (it fires
again only after the layer has recovered). The checks and why each threshold is where it is
(healthy and collapsed runs, commands and values) are in docs/design/routing_monitor.md:

* `dead_experts`: at least `monitor.dead_experts` experts of a layer got no token in a window;
* `load_imbalance`: a layer's max expert load / mean load above `monitor.load_imbalance_high`;
* `load_entropy`: a layer's normalised load entropy below `monitor.load_entropy_low`;
* `token_entropy`: a layer's normalised per-token router entropy above
  `monitor.token_entropy_high`: its scores are still near uniform, it is not learning to route.

Checks are per layer because collapse is: one layer with three dead experts hides in a
four-layer average. A threshold of 0 (dead_experts, load_imbalance_high, load_entropy_low) or
above 1 (token_entropy_high) turns its check off.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Optional

from moe.config import MonitorConfig

_LAYER_KEY = re.compile(r"^moe/layer(\d+)/(\w+)$")


@dataclass(frozen=True)
class Check:
    name: str
    metric: str  # the per-layer metric it reads (moe/layer{i}/<metric>)
    bad: Callable[[float], bool]
    describe: Callable[[int, float], str]  # (layer, value) -> what is wrong


@dataclass(frozen=True)
class Alert:
    name: str
    layer: int
    step: int
    text: str

    def __str__(self) -> str:
        return f"step {self.step}: {self.name} (layer {self.layer})"


def build_checks(cfg: MonitorConfig, n_experts: Optional[int] = None) -> list[Check]:
    of_e = f" of {n_experts}" if n_experts else ""
    checks = []
    if cfg.dead_experts > 0:
        checks.append(Check(
            "dead_experts", "dead_experts", lambda v: v >= cfg.dead_experts,
            lambda i, v: f"layer {i}: {int(v)}{of_e} experts got no tokens (dead experts; "
                         f"monitor.dead_experts={cfg.dead_experts})"))
    if cfg.load_imbalance_high > 0:
        checks.append(Check(
            "load_imbalance", "load_imbalance", lambda v: v > cfg.load_imbalance_high,
            lambda i, v: f"layer {i}: load imbalance {v:.2f} (max/mean expert load) above "
                         f"monitor.load_imbalance_high={cfg.load_imbalance_high}: tokens pile onto few experts"))
    if cfg.load_entropy_low > 0:
        checks.append(Check(
            "load_entropy", "load_entropy_norm", lambda v: v < cfg.load_entropy_low,
            lambda i, v: f"layer {i}: normalised load entropy {v:.3f} below monitor.load_entropy_low="
                         f"{cfg.load_entropy_low}: expert collapse"))
    if cfg.token_entropy_high <= 1:
        checks.append(Check(
            "token_entropy", "token_entropy_norm", lambda v: v > cfg.token_entropy_high,
            lambda i, v: f"layer {i}: normalised routing entropy {v:.3f} above monitor.token_entropy_high="
                         f"{cfg.token_entropy_high}: near-uniform router scores, the router is not learning"))
    return checks


class RoutingMonitor:
    """Feed it each logged record; it returns the alerts that fire at that record."""

    def __init__(self, cfg: MonitorConfig, n_experts: Optional[int] = None):
        self.cfg = cfg
        self.checks = build_checks(cfg, n_experts)
        self.streak: dict[tuple[str, int], int] = {}

    def check(self, scalars: dict) -> list[Alert]:
        step = int(scalars.get("step", 0))
        if step < self.cfg.start_step:
            return []
        per_layer: dict[str, dict[int, float]] = {}
        for key, value in scalars.items():
            m = _LAYER_KEY.match(key)
            if m and isinstance(value, (int, float)) and math.isfinite(value):
                per_layer.setdefault(m.group(2), {})[int(m.group(1))] = float(value)
        alerts = []
        for c in self.checks:
            for layer, value in sorted(per_layer.get(c.metric, {}).items()):
                key = (c.name, layer)
                self.streak[key] = self.streak.get(key, 0) + 1 if c.bad(value) else 0
                if self.streak[key] == self.cfg.patience:
                    alerts.append(Alert(c.name, layer, step, f"{c.describe(layer, value)} "
                                                              f"for {self.cfg.patience} log steps"))
        return alerts
