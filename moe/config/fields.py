"""Field paths of the schema, as dotted names (`model.router.top_k`) and as the command line names them."""

from __future__ import annotations

import dataclasses

from moe.config.schema import VARIANT_GROUPS, Config


def field_paths(cls: type = Config, prefix: str = "") -> list[str]:
    """Every leaf field of the schema as a dotted path (`model.router.top_k`, `optim.lr`, `seed`)."""
    out = []
    for f in dataclasses.fields(cls):
        sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        section = isinstance(sub, type) and dataclasses.is_dataclass(sub)
        out += field_paths(sub, f"{prefix}{f.name}.") if section else [f"{prefix}{f.name}"]
    return out


def canonical_field(name: str) -> str:
    """A field as the command line names it (`router.top_k`) -> its schema path (`model.router.top_k`)."""
    return f"model.{name}" if name.split(".")[0] in VARIANT_GROUPS else name


def is_field_or_section(name: str) -> bool:
    """Whether `name` is a field or section of the schema; any key of a variant section counts
    (`router.top_k`): the schema knows no variant, the variant's own Config knows its options."""
    path = canonical_field(name)
    parts = path.split(".")
    if len(parts) > 2 and parts[0] == "model" and parts[1] in VARIANT_GROUPS:
        return True
    return any(p == path or p.startswith(path + ".") for p in field_paths())
