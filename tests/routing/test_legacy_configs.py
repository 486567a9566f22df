"""Configs and checkpoints written before each router owned its options (the flat 15-field router
section: tests/fixtures/make_legacy_router_fixtures.py) still load and resume: each keeps the
fields of its router and drops the others, as that router ignored them then."""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_dir

from moe.config import to_dict
from moe.errors import ConfigError
from moe.loading import load_model
from moe.routing.routers import LEGACY_FIELDS, ROUTERS
from moe.train.resume import config_changes
from moe.variants import from_dict, load_config
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures"
LEGACY = json.loads((FIXTURES / "legacy_router_configs.json").read_text())


def todays(router: str):
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return load_config(compose(config_name="config", overrides=[f"router={router}"]))


def test_the_fixture_has_the_old_flat_layout():
    for saved in LEGACY.values():
        assert set(saved["model"]["router"]) == {"name", *LEGACY_FIELDS}


@pytest.mark.parametrize("router", sorted(LEGACY))
def test_an_old_config_reads_as_todays_equivalent(router):
    old = from_dict(LEGACY[router])
    assert old.model.router == todays(router).model.router
    assert set(to_dict(old)["model"]["router"]) == {"name", *ROUTERS.option_names(router)}
    # what the resume check compares, over the model (other defaults, e.g. train.max_steps, moved since)
    assert [c for c in config_changes(old, todays(router)) if c.field.startswith("model.")] == []


def test_an_old_config_with_a_changed_value_is_still_a_change():
    saved = json.loads(json.dumps(LEGACY["switch"]))
    saved["model"]["router"]["capacity_factor"] = 2.0
    changes = [c for c in config_changes(from_dict(saved), todays("switch")) if c.field.startswith("model.")]
    assert [(c.field, c.old, c.new) for c in changes] == [("model.router.capacity_factor", 2.0, 1.25)]


def test_only_the_old_flat_fields_are_dropped_from_a_saved_config():
    saved = json.loads(json.dumps(LEGACY["topk"]))
    saved["model"]["router"]["gate_bias"] = 1.0  # never a router field: not silently dropped
    with pytest.raises(ConfigError, match=r"^router.gate_bias: not an option of router.name='topk'"):
        from_dict(saved)
    with pytest.raises(ConfigError, match=r"^router.sinkhorn_iters: not an option"):  # given today, it is refused
        load_config({"router": {"name": "topk", "sinkhorn_iters": 3}})


def test_an_old_checkpoint_loads_with_its_router_state():
    model, _, cfg = load_model(FIXTURES / "legacy_router_aux_free.pt")
    router = model.layers[0].ffn.router
    assert (cfg.model.router.name, cfg.model.router.score_func, cfg.model.router.bias_update_rate) == ("aux_free",
                                                                                                     "sigmoid", 0.01)
    assert not hasattr(cfg.model.router, "sinkhorn_iters")
    assert router.e_score_correction_bias.tolist() == [0.5, -0.25, 0.0, 0.125]
    out = model(torch.arange(8).view(1, 8))
    assert out.logits.shape == (1, 8, 64) and torch.isfinite(out.logits).all()
