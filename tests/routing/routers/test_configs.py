"""Each router owns its options: its `Config` (common options from `RouterConfig`), its yaml
lists exactly those options at the Config's defaults, and an option of another router is refused."""

import dataclasses

import pytest
from omegaconf import OmegaConf

from moe.errors import ConfigError
from moe.routing.routers import ROUTERS, RouterConfig, router_config
from tests.conftest import REPO
from tests.routing.routers.test_router_variants import VARIANTS, yaml_cfg


def test_every_variant_is_registered_with_a_complete_yaml():
    assert sorted(VARIANTS) == list(ROUTERS)
    for name in VARIANTS:
        raw = OmegaConf.to_container(OmegaConf.load(REPO / "configs" / "router" / f"{name}.yaml"))
        assert raw.pop("name") == name
        # exactly the router's own options, at its Config's defaults (the yaml holds no second set)
        assert raw == dataclasses.asdict(router_config(name)), name
        assert issubclass(ROUTERS.options(name), RouterConfig) and ROUTERS.options(name).name == name
        doc = ROUTERS.get(name).__doc__
        assert "Stages" in doc, name


# An option a router does not have (it would be ignored) is refused, naming the router's options.
FOREIGN_OPTIONS = [("switch", "score_func"), ("sinkhorn", "score_func"), ("expert_choice", "score_func"),
                   ("expert_choice", "n_groups"), ("hash", "n_groups"), ("topk", "sinkhorn_iters"),
                   ("topk", "bias_update_rate"), ("sinkhorn", "seq_aux_loss_coef")]


@pytest.mark.parametrize("name,option", FOREIGN_OPTIONS)
def test_an_option_of_another_router_is_refused_naming_the_routers_options(name, option):
    with pytest.raises(ConfigError) as e:
        yaml_cfg(name, **{option: 2})
    assert str(e.value) == (f"router.{option}: not an option of router.name={name!r}; "
                            f"its options are {ROUTERS.option_names(name)}")


def test_a_variant_that_inherits_another_routers_config_is_refused(monkeypatch):
    topk = ROUTERS.lookup("topk")
    monkeypatch.setitem(ROUTERS._items, "copy_of_topk", type("CopyOfTopK", (topk,), {}))
    with pytest.raises(TypeError, match="router 'copy_of_topk' has the Config of router 'topk'"):
        router_config("copy_of_topk")
