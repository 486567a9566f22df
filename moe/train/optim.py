"""AdamW with decoupled weight decay on matrices only, and the warmup + cosine schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from moe.config import OptimConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay 2-D+ weights (projections, experts, embeddings); never norms or other vectors."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    impl = cfg.impl
    if impl == "auto":
        # fused AdamW exists for CPU and CUDA in current torch; foreach is the portable fallback
        impl = "fused" if device.type in ("cpu", "cuda") else "foreach"
    kwargs = {"fused": impl == "fused", "foreach": impl == "foreach" if impl != "fused" else None}
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             eps=cfg.eps, **kwargs)


def lr_at(step: int, cfg: OptimConfig, max_steps: int) -> float:
    """Linear warmup over `warmup_steps`, then cosine decay to `lr * min_lr_ratio` at `max_steps`."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, max_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    min_lr = cfg.lr * cfg.min_lr_ratio
    return min_lr + 0.5 * (cfg.lr - min_lr) * (1.0 + math.cos(math.pi * progress))
