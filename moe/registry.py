"""A tiny name -> variant registry, shared by routers, expert dispatch, attention backends
(training and paged) and evaluation tasks.

A new variant is one module that decorates its class (or function) with
`@REGISTRY.register("name")` plus one YAML file in `configs/`. The registry is the one place a
variant name is checked: an unknown name is a ConfigError naming the config field and listing
the known ones. A variant that cannot run everywhere (flash-attn, the Triton kernels) defines
`unavailable_reason()` returning why it cannot run here (or None); `get` asks it, so such a
variant fails when the model or engine is built, with an `UnavailableError`, never mid-run.
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, Optional, TypeVar

from moe.errors import ConfigError, UnavailableError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind  # the config field that selects a variant, e.g. "router.name"
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} variant {name!r} is registered twice")
            self._items[name] = obj
            return obj
        return deco

    def lookup(self, name: str) -> T:
        """The variant registered as `name`, without checking that it can run here."""
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

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def __len__(self) -> int:
        return len(self._items)
