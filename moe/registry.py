"""The one name -> variant registry of every variant kind: routers, expert dispatch, attention
backends (training and paged), HF families, quantization schemes and evaluation tasks.

A new variant is one module that decorates its class (or function) with
`@REGISTRY.register("name")` (plus one YAML file in `configs/` where a config group exists).
A registry made with `package=` imports every module of that package the first time it is asked
for a name (`discover`), so no `__init__.py` lists the variants: adding the module is enough.

The registry is the one place a variant name is checked: an unknown name is a ConfigError naming
the config field and listing the known ones. A variant that cannot run everywhere (flash-attn,
the Triton kernels) defines `unavailable_reason()` returning why it cannot run here (or None);
`get` asks it, so such a variant fails when the model or engine is built, with an
`UnavailableError`, never mid-run.

A variant with options owns them: a dataclass named `Config` on the variant (torchtitan keeps a
router's options in the router's own config). `make_config(name, options, prefix)` merges a
mapping of options onto it; an option the variant does not have is a ConfigError naming it and
the variant's options, so `router=topk router.sinkhorn_iters=3` is refused, not ignored.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any, Callable, Generic, Iterator, Mapping, Optional, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from moe.errors import ConfigError, UnavailableError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, package: Optional[str] = None):
        self.kind = kind  # the config field that selects a variant, e.g. "router.name"
        self.package = package  # every module of it registers variants (imported by `discover`)
        self._items: dict[str, T] = {}
        self._discovered = package is None

    def discover(self) -> None:
        """Import every module of `package` once, so that each registers its variants. Modules
        whose name starts with `_` and the package's `base` module (the interface) are skipped."""
        if self._discovered:
            return
        self._discovered = True  # set first: a module being imported may ask this registry
        pkg = importlib.import_module(self.package)
        for mod in pkgutil.iter_modules(pkg.__path__):
            if not mod.name.startswith("_") and mod.name != "base":
                importlib.import_module(f"{self.package}.{mod.name}")

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} variant {name!r} is registered twice")
            self._items[name] = obj
            return obj
        return deco

    def lookup(self, name: str) -> T:
        """The variant registered as `name`, without checking that it can run here."""
        self.discover()
        if name not in self._items:
            raise ConfigError(f"{self.kind}={name!r} is unknown; choose one of {sorted(self._items)}")
        return self._items[name]

    def unavailable_reason(self, name: str) -> Optional[str]:
        """Why variant `name` cannot run on this machine, or None when it can (unknown names raise)."""
        reason = getattr(self.lookup(name), "unavailable_reason", None)
        return reason() if reason is not None else None

    def get(self, name: str) -> T:
        """The variant registered as `name`; an UnavailableError if it cannot run here."""
        obj = self.lookup(name)
        reason = self.unavailable_reason(name)
        if reason is not None:
            raise UnavailableError(reason)
        return obj

    def options(self, name: str) -> Optional[type]:
        """The dataclass of variant `name`'s options (its `Config`), or None when it has none."""
        config = getattr(self.lookup(name), "Config", None)
        return config if dataclasses.is_dataclass(config) else None

    def option_names(self, name: str) -> list[str]:
        config = self.options(name)
        return [f.name for f in dataclasses.fields(config)] if config is not None else []

    def make_config(self, name: str, options: Mapping[str, Any], prefix: str) -> Any:
        """Variant `name`'s `Config` with `options` merged onto its defaults (None when it has no
        options and none are given). `prefix` is the config path shown in errors ("router")."""
        allowed = self.option_names(name)
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            listed = ", ".join(f"{prefix}.{k}" for k in unknown)
            has = f"its options are {allowed}" if allowed else "it has no options"
            raise ConfigError(f"{listed}: not an option of {self.kind}={name!r}; {has}")
        config = self.options(name)
        if config is None:
            return None
        try:  # OmegaConf checks each value against the field's type, as for the rest of the config
            return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(config), dict(options)))
        except OmegaConfBaseException as e:
            key = getattr(e, "full_key", None) or "?"
            raise ConfigError(f"bad value for {prefix}.{key} ({self.kind}={name!r}): "
                              f"{str(e).splitlines()[0]}") from None

    def __contains__(self, name: object) -> bool:
        self.discover()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        self.discover()
        return iter(sorted(self._items))

    def __len__(self) -> int:
        self.discover()
        return len(self._items)
