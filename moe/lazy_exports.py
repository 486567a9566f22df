"""Package exports resolved on first use (PEP 562), so that importing a light part of a package
does not import its heavy parts with it (moe.data: `datasets`, torch; moe.engine: the runner,
the sampler, guided decoding and the model)."""

from __future__ import annotations

import importlib
from typing import Callable


def lazy_exports(package: str, exports: dict[str, str], namespace: dict) -> tuple[Callable, Callable]:
    """`__getattr__, __dir__ = lazy_exports(__name__, {"Name": "module.path"}, globals())`. A
    resolved name is stored in `namespace`, so later lookups skip `__getattr__`."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = namespace[name] = getattr(importlib.import_module(exports[name]), name)
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
