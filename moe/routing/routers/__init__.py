"""Router variants, registered by name (`router.name` / `configs/router/<name>.yaml`): each module of
this package is one variant with its own options (`Config`); `ROUTERS` finds them by discovery, so
adding a router is one module here and one yaml in configs/router/."""

import torch

from moe.errors import ConfigError
from moe.routing.routers.base import ROUTERS, Router, RouterOutput

__all__ = ["ROUTERS", "Router", "RouterOutput", "build_router", "rebuild_router"]


def build_router(cfg, d_model: int, n_experts: int) -> Router:
    return ROUTERS.get(cfg.name)(cfg, d_model, n_experts)


def rebuild_router(old: Router, cfg, refusal: str) -> Router:
    """A router of `cfg.router` that shares `old`'s weights and buffers (nothing copied, nothing
    initialised): how a trained model routes differently without retraining. A buffer whose shape
    the new settings change (it was learnt for the old ones) is a ConfigError: `refusal`, then why."""
    with torch.device("meta"):  # its own weights are replaced by the old router's below
        new = build_router(cfg.router, cfg.d_model, cfg.n_experts)
    for name, p in old.named_parameters(recurse=False):
        setattr(new, name, p)
    for name, b in old.named_buffers(recurse=False):
        if new._buffers.get(name) is None or new._buffers[name].shape != b.shape:
            raise ConfigError(f"{refusal}: its buffer {name!r} depends on them")
        new._buffers[name] = b
    new.train(old.training)
    return new
