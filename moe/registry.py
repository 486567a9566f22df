"""A tiny name -> class registry, shared by routers, expert dispatch and attention backends.

A new variant is one module that decorates its class with `@REGISTRY.register("name")`
plus one YAML file in `configs/`; an unknown name is an error listing the known ones.
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

    def get(self, name: str) -> T:
        if name not in self._items:
            from moe.config import ConfigError
            raise ConfigError(f"{self.kind}={name!r} is unknown; choose one of {sorted(self._items)}")
        return self._items[name]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def __len__(self) -> int:
        return len(self._items)
