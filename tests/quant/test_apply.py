"""moe/quant/apply.py: a QuantSpec holds the scheme's own options, refuses the ones it lacks, and
reads the records older checkpoints wrote; the eval yaml lets every scheme option be typed."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from moe.errors import ConfigError
from moe.quant import QUANT_SCHEMES, QuantSpec, sweep_specs

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "quant"


@pytest.mark.parametrize("scheme,options", [("int8", {"group_size": 64}), ("int8", {"calib_path": "c.txt"}),
                                            ("fp8", {"group_size": 3}), ("none", {"n_grid": 5})])
def test_an_option_the_scheme_lacks_is_refused_naming_it(scheme, options):
    (name,) = options
    with pytest.raises(ConfigError) as e:
        QuantSpec(scheme, **options)
    assert str(e.value) == f"quant.{name}: not an option of quantization={scheme!r}; it has no options"


def test_each_scheme_checks_its_own_options():
    with pytest.raises(ConfigError, match=r"^quant.group_size=3 must be even \(two int4 codes per byte\)$"):
        QuantSpec("int4", group_size=3)
    with pytest.raises(ConfigError, match=r"^quant.calib_path: not an option of quantization='int4'; "
                                          r"its options are \['group_size'\]$"):
        QuantSpec("int4", calib_path="c.txt")
    with pytest.raises(ConfigError, match=r"^quant.n_grid=0 must be a positive int$"):
        QuantSpec("awq", n_grid=0)
    awq = QuantSpec.coerce({"scheme": "awq", "calib_path": "c.txt", "group_size": 64})
    assert (awq.calib_path, awq.group_size, awq.calib_tokens, awq.build().group_size) == ("c.txt", 64, 4096, 64)
    assert QuantSpec("int8").as_dict() == {"scheme": "int8"}


def test_a_record_of_an_older_checkpoint_keeps_only_the_schemes_options():
    old = {"scheme": "int8", "group_size": 128, "calib_path": None, "calib_tokens": 4096, "n_grid": 20}
    assert QuantSpec.from_record(old) == QuantSpec("int8")
    assert QuantSpec.from_record(dict(old, scheme="int4", group_size=32)) == QuantSpec("int4", group_size=32)
    assert not QuantSpec.from_record(None).enabled


def test_a_sweep_gives_each_scheme_the_options_it_has():
    specs = sweep_specs(["none", "int8", "int4", "awq"], {"group_size": 32, "calib_path": "c.txt"})
    assert specs["int8"] == QuantSpec("int8") and specs["int4"] == QuantSpec("int4", group_size=32)
    assert specs["awq"] == QuantSpec("awq", group_size=32, calib_path="c.txt")
    with pytest.raises(ConfigError, match=r"^quant.calib_path: not an option of any compared scheme"):
        sweep_specs(["none", "int8", "int4"], {"calib_path": "c.txt"})


def test_the_kernel_format_is_the_schemes_own():
    formats = {name: QUANT_SCHEMES.lookup(name).kernel_format for name in QUANT_SCHEMES}
    assert formats == {"awq": "int4", "fp8": "fp8", "fp8_weight": "fp8", "int4": "int4", "int8": "int8",
                       "mxfp4": "mxfp4"}


def test_the_quant_yamls_offer_every_scheme_option_and_set_only_their_scheme():
    base = OmegaConf.load(CONFIGS / "none.yaml")
    options = {o for name in QUANT_SCHEMES for o in QUANT_SCHEMES.option_names(name)}
    assert set(base) - {"scheme", "schemes"} == options  # `quant.<option>=` typeable for every scheme
    assert all(base[o] is None for o in options)  # null: the scheme's own default, written once in its Config
    for name in QUANT_SCHEMES:
        cfg = OmegaConf.load(CONFIGS / f"{name}.yaml")
        assert cfg.scheme == name and set(cfg) == {"defaults", "scheme"}
    assert {p.stem for p in CONFIGS.glob("*.yaml")} == {"none", *QUANT_SCHEMES}
