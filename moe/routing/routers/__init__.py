"""Router variants, registered by name (`router.name` / `configs/router/<name>.yaml`): each module of
this package is one variant with its own options (`Config`); `ROUTERS` finds them by discovery, so
adding a router is one module here and one yaml in configs/router/."""

from typing import Any

import torch

from moe.config import VariantConfig
from moe.errors import ConfigError
from moe.meta import meta_device
from moe.routing.routers.base import LEGACY_FIELDS, ROUTERS, GroupLimitedConfig, Router, RouterConfig, RouterOutput

__all__ = ["ROUTERS", "GroupLimitedConfig", "Router", "RouterConfig", "RouterOutput", "build_router",
           "rebuild_router", "resolve_router", "retarget_router", "router_config"]


def router_config(name: str = "topk", **options: Any) -> RouterConfig:
    """Router `name`'s own Config with `options` on its defaults; an option it does not have is a
    ConfigError naming it and the router's options (values are checked against the model by
    `Config.check`, when the model config is validated or the router built)."""
    cfg = ROUTERS.make_config(name, options, "router")
    if cfg.name != name:  # a variant that inherits another's Config would be built as that one
        raise TypeError(f"router {name!r} has the Config of router {cfg.name!r}: give it its own (name = {name!r})")
    return cfg


def resolve_router(section: Any, stored: bool = False) -> RouterConfig:
    """The router's own Config of a model's `router` section: a VariantConfig's options merged
    onto it (an already resolved Config is returned as is). `stored`: the section comes from a
    saved config (checkpoint, run directory), where configs written before each router owned its
    options hold every flat router field; the fields of other routers are dropped, as that router
    ignored them then."""
    if not isinstance(section, VariantConfig):
        return section
    options = dict(section.options)
    if stored:
        own = set(ROUTERS.option_names(section.name))
        options = {k: v for k, v in options.items() if k in own or k not in LEGACY_FIELDS}
    return router_config(section.name, **options)


def build_router(cfg: RouterConfig, d_model: int, n_experts: int) -> Router:
    cfg.check(n_experts)
    return ROUTERS.get(cfg.name)(cfg, d_model, n_experts)


def rebuild_router(old: Router, cfg, refusal: str) -> Router:
    """A router of `cfg.router` that shares `old`'s weights and buffers (nothing copied, nothing
    initialised): how a trained model routes differently without retraining. A buffer whose shape
    the new settings change (it was learnt for the old ones) is a ConfigError: `refusal`, then why."""
    with meta_device():  # its own weights are replaced by the old router's below
        new = build_router(cfg.router, cfg.d_model, cfg.n_experts)
    for name, p in old.named_parameters(recurse=False):
        setattr(new, name, p)
    for name, b in old.named_buffers(recurse=False):
        if new._buffers.get(name) is None or new._buffers[name].shape != b.shape:
            raise ConfigError(f"{refusal}: its buffer {name!r} depends on them")
        new._buffers[name] = b
    new.train(old.training)
    return new


@torch.no_grad()
def retarget_router(old: Router, cfg: RouterConfig, d_model: int, n_experts: int,
                    init_std: float) -> tuple[Router, list[str]]:
    """A router of variant `cfg` that starts from `old`, to be trained (fine-tuning a loaded model
    with another router): each parameter and persistent buffer the new variant has under the same
    name and shape is `old`'s (shared, not copied: every variant's gate `weight`); the others start
    as a freshly built router's (its constructor's buffers, e.g. aux_free's bias at 0, hash's
    table; a parameter from N(0, init_std)). Unlike `rebuild_router` a buffer may change shape:
    it starts again. Returns the router and the names that started fresh."""
    device = old.weight.device
    with torch.device(device):
        new = build_router(cfg, d_model, n_experts)
    fresh = []
    for name, p in list(new.named_parameters(recurse=False)):
        mine = old._parameters.get(name)
        if mine is not None and mine.shape == p.shape:
            mine.requires_grad_(p.requires_grad)  # e.g. hash routing's unused gate stays frozen
            setattr(new, name, mine)
        else:
            torch.nn.init.normal_(p, 0.0, init_std)
            fresh.append(name)
    for name, b in list(new.named_buffers(recurse=False)):
        if name in new._non_persistent_buffers_set:
            continue  # run-time state (aux_free's load counts): starts at its constructor's value
        mine = old._buffers.get(name)
        if mine is not None and mine.shape == b.shape:
            new._buffers[name] = mine
        else:
            fresh.append(name)
    new.train(old.training)
    return new, fresh
