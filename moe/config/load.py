"""Merging a Hydra / OmegaConf / dict config onto the schema, then checking it."""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from moe.config.checks import validate
from moe.config.schema import VARIANT_GROUPS, Config, VariantConfig
from moe.errors import ConfigError


def nest_variant_groups(raw: DictConfig) -> DictConfig:
    """Move top-level `router` / `attention` / `experts` sections (the Hydra groups of the command
    line, and the layout of older checkpoints' configs) under `model`. A section given both ways
    is merged, the top-level values winning (they are what the command line said)."""
    top = {g: raw[g] for g in VARIANT_GROUPS if g in raw}
    if not top:
        return raw
    rest = OmegaConf.masked_copy(raw, [k for k in raw.keys() if k not in VARIANT_GROUPS])
    model = rest.get("model") if rest.get("model") is not None else OmegaConf.create({})
    rest["model"] = OmegaConf.merge(model, top)
    return rest


def _as_choices(raw: DictConfig) -> DictConfig:
    """Each flat variant section under `model` (`{name: topk, top_k: 1}`, as the command line, the
    yaml files and every saved config write it) as a VariantConfig's `{name, options}`."""
    model = raw.get("model")
    if model is None:
        return raw
    for group in VARIANT_GROUPS:
        section = model.get(group)
        if isinstance(section, DictConfig):
            flat = OmegaConf.to_container(section, resolve=True)
            choice = {"options": {k: v for k, v in flat.items() if k != "name"}}
            if "name" in flat:
                choice["name"] = flat["name"]
            model[group] = choice
    return raw


def load_config(raw: Any) -> Config:
    """Merge a Hydra/OmegaConf/dict config onto the schema and validate it.

    Unknown keys and wrongly typed values become a ConfigError naming the key. The variant sections
    (`model.router`, ...) come back as VariantConfigs, their options unchecked: entry points load
    with `moe.variants.load_config`, which also resolves them onto each variant's own Config.
    """
    if isinstance(raw, Config):
        return validate(raw)
    if not isinstance(raw, DictConfig):
        raw = OmegaConf.create(raw)
    raw = OmegaConf.masked_copy(raw, [k for k in raw.keys() if k != "hydra"])
    raw = _as_choices(nest_variant_groups(raw))
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Config), raw)
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        msg = str(e).splitlines()[0]
        if "not in" in msg or "Key" in msg and "not" in msg:
            raise ConfigError(f"unknown config key {key!r}: {msg}") from None
        raise ConfigError(f"bad value for {key!r}: {msg}") from None
    return validate(cfg)


def variant_dict(section: Any) -> dict:
    """A variant section as it is written: flat, its name first (a VariantConfig's options, or
    the fields of a variant's own Config, whose `name` is a class attribute)."""
    options = section.options if isinstance(section, VariantConfig) else dataclasses.asdict(section)
    return {"name": section.name, **options}


def to_dict(cfg: Config) -> dict:
    d = dataclasses.asdict(cfg)
    for group in VARIANT_GROUPS:
        d["model"][group] = variant_dict(getattr(cfg.model, group))
    return d


def from_dict(d: dict) -> Config:
    return load_config(OmegaConf.create(d))
