"""Custom kernels (Triton), each with a plain PyTorch reference beside it.

Why the code below: Hugging Face publishes a package whose import name is also `kernels` (the
`kernels` distribution, hub-downloaded kernels), and transformers >= 5.25 requires it and runs
`from kernels import CUDAProperties, ...` when it is imported. This directory is named by the
project's layout and sits first on `sys.path` in a checkout, so it shadows that package and every HF
model build failed with an ImportError. Rather than rename the project's kernels (`python -m
kernels.compile_check` is how users call them) or pin transformers below its newest release, the two
share the name: HF's package directory is appended to this package's `__path__` (so its
`kernels._internals` / `kernels._rust` submodules resolve there; no submodule name is shared), and
its public names are forwarded lazily from a copy of its `__init__` run on first use. Without the HF
distribution installed nothing changes.
"""
import ast
import functools
import importlib.metadata
import types
from pathlib import Path

_HUB_DISTRIBUTION = "kernels"


def _hub_package_dir() -> Path | None:
    """HF's `kernels` package directory when that distribution is installed, else None."""
    try:
        init = Path(importlib.metadata.distribution(_HUB_DISTRIBUTION).locate_file("kernels/__init__.py"))
    except importlib.metadata.PackageNotFoundError:
        return None
    if not init.is_file() or init.resolve() == Path(__file__).resolve():
        return None
    return init.parent


_HUB_DIR = _hub_package_dir()
if _HUB_DIR is not None:
    __path__.append(str(_HUB_DIR))  # noqa: F821 -- a package's own __path__


@functools.lru_cache(maxsize=1)
def _hub_namespace() -> types.ModuleType:
    """HF's `kernels/__init__.py` run once in a module of its own (its imports go through __path__)."""
    init = _HUB_DIR / "__init__.py"
    module = types.ModuleType(f"{__name__}._hub_init")
    module.__file__, module.__package__ = str(init), __name__
    exec(compile(init.read_text(), str(init), "exec"), module.__dict__)
    return module


@functools.lru_cache(maxsize=1)
def _hub_exports() -> frozenset[str]:
    """The names HF's `__init__` lists in `__all__`, read without running it (so looking up a name
    that is neither ours nor HF's never imports HF's package)."""
    for node in ast.parse((_HUB_DIR / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return frozenset(ast.literal_eval(node.value))
    return frozenset()


def __getattr__(name: str):
    if _HUB_DIR is None or name not in _hub_exports():
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return getattr(_hub_namespace(), name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
