"""AdamW with decoupled weight decay on matrices only, and the warmup + cosine schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from moe.config import OptimConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay 2-D+ weights (projections, experts, embeddings); never norms or other vectors.

    Within each, FSDP-sharded parameters (DTensors) and plain tensors (e.g. expert-parallel
    slices left out of FSDP) go to separate groups: fused and foreach AdamW take one kind of
    tensor per group. On one process there are no DTensors, so the order is simply every decayed
    parameter, then every other one, in `model.parameters()` order."""
    from torch.distributed.tensor import DTensor  # here: importing it costs ~0.5 s, and one process has none
    groups = []
    for decay in (True, False):
        ps = [p for p in model.parameters() if p.requires_grad and (p.dim() >= 2) == decay]
        for sharded in (True, False):
            kind = [p for p in ps if isinstance(p, DTensor) == sharded]
            if kind:
                groups.append({"params": kind, "weight_decay": weight_decay if decay else 0.0})
    return groups


def param_names_in_order(model: nn.Module) -> list[str]:
    """Parameter names in the order a single-process optimizer built by `build_optimizer` holds
    them (what the positions of a single-file checkpoint's optimizer state refer to)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for g in param_groups(model, 0.0) for p in g["params"]]


def build_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    impl = cfg.impl
    if impl == "auto":
        # fused AdamW exists for CPU and CUDA in current torch; foreach is the portable fallback
        impl = "fused" if device.type in ("cpu", "cuda") else "foreach"
    kwargs = {"fused": impl == "fused", "foreach": impl == "foreach" if impl != "fused" else None}
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             eps=cfg.eps, **kwargs)


# A run warms up over at most this fraction of its steps: `optim.warmup_steps` is sized for full
# runs, and a short run (a smoke test, a 60-step ablation) would otherwise spend all of its steps
# warming up and end at the peak learning rate, never decaying.
MAX_WARMUP_FRACTION = 0.25


def warmup_steps(cfg: OptimConfig, max_steps: int) -> int:
    """The warmup actually used: `optim.warmup_steps`, capped at a quarter of `max_steps`."""
    return min(cfg.warmup_steps, int(MAX_WARMUP_FRACTION * max_steps))


def warmup_warning(cfg: OptimConfig, max_steps: int) -> str | None:
    """What to tell the user when the cap shortens the configured warmup, else None."""
    used = warmup_steps(cfg, max_steps)
    if used == cfg.warmup_steps:
        return None
    return (f"train.max_steps={max_steps} is short for optim.warmup_steps={cfg.warmup_steps}: warming up over "
            f"{used} step{'' if used == 1 else 's'} (at most {MAX_WARMUP_FRACTION:.0%} of the run) so that the learning rate still decays "
            f"to optim.min_lr_ratio by the end")


def lr_at(step: int, cfg: OptimConfig, max_steps: int) -> float:
    """Linear warmup (`warmup_steps`), then cosine decay to `lr * min_lr_ratio` at `max_steps`."""
    warmup = warmup_steps(cfg, max_steps)
    if warmup and step < warmup:
        return cfg.lr * (step + 1) / warmup
    span = max(1, max_steps - warmup)
    progress = min(1.0, (step - warmup) / span)
    min_lr = cfg.lr * cfg.min_lr_ratio
    return min_lr + 0.5 * (cfg.lr - min_lr) * (1.0 + math.cos(math.pi * progress))
