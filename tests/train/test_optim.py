"""The learning-rate schedule (moe/train/optim.py): warmup, cosine decay, and the warmup cap
that lets a short run decay."""

from __future__ import annotations

import pytest

from moe.config import OptimConfig
from moe.train.optim import lr_at, warmup_warning


def test_short_runs_warm_up_over_a_fraction_and_decay():
    cfg = OptimConfig(lr=1e-3, warmup_steps=20, min_lr_ratio=0.1)
    lrs = [lr_at(s, cfg, 12) for s in range(12)]
    assert lrs[2] == pytest.approx(1e-3)  # warmed up over 3 steps (a quarter of 12), not 20
    assert lrs[-1] < 0.15e-3 and lrs == sorted(lrs[:3]) + sorted(lrs[3:], reverse=True)
    assert "train.max_steps=12 is short for optim.warmup_steps=20: warming up over 3 steps" in warmup_warning(cfg, 12)
    assert warmup_warning(cfg, 300) is None and lr_at(19, cfg, 300) == pytest.approx(1e-3)  # full runs unchanged
