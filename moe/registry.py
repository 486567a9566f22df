"""A tiny name -> class registry, shared by routers, expert dispatch and attention backends.

A new variant is one module that decorates its class with `@REGISTRY.register("name")`
plus one YAML file in `configs/`; an unknown name is an error listing the known ones.
A variant that cannot run everywhere (flash attention, the Triton kernels) carries
`check_available()` (raises ConfigError saying why) and `unavailable_reason()` (the reason or
None); `get` runs the check, so such a variant fails when the model is built, not mid-run.
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

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
            from moe.config import ConfigError
            raise ConfigError(f"{self.kind}={name!r} is unknown; choose one of {sorted(self._items)}")
        return self._items[name]

    def get(self, name: str) -> T:
        """The variant registered as `name`; raises ConfigError if it cannot run here."""
        obj = self.lookup(name)
        check = getattr(obj, "check_available", None)
        if check is not None:
            check()
        return obj

    def unavailable_reason(self, name: str):
        """Why variant `name` cannot run on this machine, or None when it can."""
        reason = getattr(self.lookup(name), "unavailable_reason", None)
        return reason() if reason is not None else None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def __len__(self) -> int:
        return len(self._items)
