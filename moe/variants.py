"""A model config's variant sections resolved onto each variant's own Config.

The schema (`moe.config`) knows no variant: it reads `model.router` / `model.attention` /
`model.experts` as a name and the options given (`VariantConfig`). Here, above the variants, each
section's registry checks the name and merges the options onto the variant's own `Config`
(`Registry.make_config`): an option the variant does not have is one ConfigError naming it and the
variant's options (`router=topk router.sinkhorn_iters=3`), a value is type-checked, and the variant's
Config checks its values against the model (`check_model`, through `validate_model`). A router
section becomes the router's Config (`cfg.model.router.top_k`); an expert-dispatch or attention
variant has no options today, so its section stays a name.

`load_config` / `from_dict` are `moe.config`'s followed by `resolve`: what entry points use, so every
Config they hand on is resolved. `from_dict` reads saved configs (checkpoints, run directories),
which may come from older runs: their router sections hold every flat router field of that time,
and the fields the chosen router does not have are dropped (it ignored them then too).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from moe import config as schema
from moe.attention import ATTENTION_BACKENDS
from moe.config import Config, ModelConfig, validate_model
from moe.experts import EXPERT_DISPATCH
from moe.routing.routers import resolve_router


def _optionless(registry, section: Any, group: str) -> Any:
    """A section of a variant kind whose variants have no options: any option given is refused
    (naming it), and the section stays the name (a variant that gains a `Config` gets it here)."""
    options = section.options if isinstance(section, schema.VariantConfig) else dataclasses.asdict(section)
    resolved = registry.make_config(section.name, options, group)
    return section if resolved is None else resolved


def resolve_model(m: ModelConfig, stored: bool = False) -> ModelConfig:
    """`m` with its variant sections resolved and validated (a resolved `m` comes back equal)."""
    m = dataclasses.replace(m, router=resolve_router(m.router, stored),
                            attention=_optionless(ATTENTION_BACKENDS, m.attention, "attention"),
                            experts=_optionless(EXPERT_DISPATCH, m.experts, "experts"))
    validate_model(m)
    return m


def resolve(cfg: Config, stored: bool = False) -> Config:
    return dataclasses.replace(cfg, model=resolve_model(cfg.model, stored))


def load_config(raw: Any) -> Config:
    """`moe.config.load_config`, its variant sections resolved: an entry point's config."""
    return resolve(schema.load_config(raw))


def from_dict(d: dict) -> Config:
    """A saved config (checkpoint, run directory, HF-import provenance), older layouts included."""
    return resolve(schema.from_dict(d), stored=True)
