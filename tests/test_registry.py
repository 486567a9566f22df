"""moe/registry.py: names checked once, availability asked once, variants discovered from their
package, and each variant's options merged onto its own Config."""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass

import pytest

from moe.errors import ConfigError, UnavailableError
from moe.registry import Registry


def make_registry() -> Registry:
    reg: Registry = Registry("thing.name")

    @reg.register("plain")
    class Plain:
        pass

    @reg.register("tuned")
    class Tuned:
        @dataclass
        class Config:
            width: int = 2
            scale: float = 1.0

    @reg.register("absent")
    class Absent:
        @staticmethod
        def unavailable_reason():
            return "needs a GPU; use thing=plain"

    return reg


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ConfigError) as e:
        make_registry().lookup("nope")
    assert str(e.value) == "thing.name='nope' is unknown; choose one of ['absent', 'plain', 'tuned']"


def test_registering_a_name_twice_is_refused():
    reg = make_registry()
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("plain")(object)


def test_get_raises_the_variants_own_reason():
    reg = make_registry()
    assert reg.unavailable_reason("plain") is None
    with pytest.raises(UnavailableError, match="^needs a GPU; use thing=plain$"):
        reg.get("absent")
    assert reg.lookup("absent") is not None  # lookup does not ask


def test_make_config_merges_onto_the_variants_defaults():
    reg = make_registry()
    cfg = reg.make_config("tuned", {"width": 5}, "thing")
    assert (cfg.width, cfg.scale) == (5, 1.0)
    assert reg.option_names("tuned") == ["width", "scale"]
    assert reg.make_config("plain", {}, "thing") is None


def test_an_option_the_variant_does_not_have_names_it_and_the_variants_options():
    reg = make_registry()
    with pytest.raises(ConfigError) as e:
        reg.make_config("tuned", {"width": 3, "depth": 1}, "thing")
    assert str(e.value) == "thing.depth: not an option of thing.name='tuned'; its options are ['width', 'scale']"
    with pytest.raises(ConfigError) as e:
        reg.make_config("plain", {"width": 3}, "thing")
    assert str(e.value) == "thing.width: not an option of thing.name='plain'; it has no options"


def test_a_bad_value_names_the_field():
    with pytest.raises(ConfigError) as e:
        make_registry().make_config("tuned", {"width": "wide"}, "thing")
    assert str(e.value).startswith("bad value for thing.width (thing.name='tuned'): ")


def test_discovery_imports_every_module_of_the_package(tmp_path, monkeypatch):
    pkg = tmp_path / "fake_variants_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "base.py").write_text("from moe.registry import Registry\nREG = Registry('fake.name', package='fake_variants_pkg')\n")
    for name in ("alpha", "beta"):
        (pkg / f"{name}.py").write_text(textwrap.dedent(f"""
            from fake_variants_pkg.base import REG
            @REG.register("{name}")
            class V:
                pass
        """))
    (pkg / "_private.py").write_text("raise RuntimeError('a _module is not a variant')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        from fake_variants_pkg.base import REG
        assert "fake_variants_pkg.alpha" not in sys.modules  # nothing imported before it is asked
        assert list(REG) == ["alpha", "beta"]
        assert "alpha" in REG and len(REG) == 2
    finally:
        for mod in [m for m in sys.modules if m.startswith("fake_variants_pkg")]:
            del sys.modules[mod]
