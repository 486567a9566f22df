"""Every variant kind is discovered from its package: adding a module is all it takes (no import
list, no name table), and what each registry lists is exactly what its package's modules register."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import textwrap

import pytest

from eval.tasks import EVAL_TASKS
from moe.attention import ATTENTION_BACKENDS, PAGED_BACKENDS
from moe.experts import EXPERT_DISPATCH
from moe.hf.families import FAMILIES
from moe.quant import QUANT_SCHEMES

# (registry, the module that defines it, what a planted variant module must say to register)
KINDS = {
    "experts": (EXPERT_DISPATCH, "moe.experts.base", 'EXPERT_DISPATCH.register("planted")(lambda *a: None)'),
    "attention": (ATTENTION_BACKENDS, "moe.attention.base", 'ATTENTION_BACKENDS.register("planted")(object)'),
    "paged": (PAGED_BACKENDS, "moe.attention.base", 'PAGED_BACKENDS.register("planted")(object)'),
    "families": (FAMILIES, "moe.hf.families.base", 'FAMILIES.register("planted")(object)'),
    "quant": (QUANT_SCHEMES, "moe.quant.schemes.base", 'QUANT_SCHEMES.register("planted")(object)'),
    "eval_tasks": (EVAL_TASKS, "eval.tasks.base", 'EVAL_TASKS.register("planted")(object)'),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_registered_variant_comes_from_a_module_of_the_package(kind):
    registry, _, _ = KINDS[kind]
    package = importlib.import_module(registry.package)
    modules = {f"{registry.package}.{m.name}" for m in pkgutil.iter_modules(package.__path__)}
    assert len(registry) >= 2 and {registry.lookup(name).__module__ for name in registry} <= modules
    # a module registering in none of the package's registries is a helper, imported by a variant
    # module or exported by the package itself (moe.experts.biased: the GPT-OSS experts module)
    sharing = [r for r, _, _ in KINDS.values() if r.package == registry.package]
    homes = {r.lookup(name).__module__ for r in sharing for name in r}
    for helper in modules - homes - {f"{registry.package}.base"}:
        short = helper.rsplit(".", 1)[1]
        importers = [sys.modules[m].__file__ for m in homes] + [package.__file__]
        assert any(short in open(f).read() for f in importers), f"{helper} registers nothing"


@pytest.mark.parametrize("kind", list(KINDS))
def test_adding_a_module_to_the_package_is_enough(kind, tmp_path, monkeypatch):
    registry, base, register = KINDS[kind]
    (tmp_path / "zz_planted.py").write_text(textwrap.dedent(f"""
        from {base} import {register.split('.')[0]}
        {register}
    """))
    package = importlib.import_module(registry.package)
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    monkeypatch.setattr(registry, "_items", dict(registry._items))  # restored after the test
    monkeypatch.setattr(registry, "_discovered", False)
    monkeypatch.delitem(sys.modules, f"{registry.package}.zz_planted", raising=False)
    try:
        assert "planted" in registry and "planted" in list(registry)
    finally:
        sys.modules.pop(f"{registry.package}.zz_planted", None)
