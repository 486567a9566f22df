"""`moe/routing/routers/base.py`: tests from the re-run of the first mutation run's modules
(docs/results/mutation/rerun1b/, helper mutK): the option checks' exact messages and bounds."""

import re

import pytest

from moe.errors import ConfigError
from moe.routing.routers.base import GroupLimitedConfig, RouterConfig


def _refused(cfg, n_experts, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message) + "$"):
        cfg.check(n_experts)


@pytest.mark.parametrize("fields, message", [
    (dict(top_k=0), "router.top_k=0 must be > 0 (and finite)"),
    (dict(top_k=5), "router.top_k=5 must be <= model.n_experts=4"),
    (dict(drop_experts=[4]), "router.drop_experts=[4] must hold distinct indices in [0, model.n_experts=4)"),
    (dict(top_k=3, drop_experts=[0, 1]),
     "router.top_k=3 must be <= the 2 experts left after router.drop_experts=[0, 1]"),
    (dict(temperature=0.0), "router.temperature=0.0 must be > 0 (and finite)"),
    (dict(aux_loss_coef=-0.5), "router.aux_loss_coef=-0.5 must be >= 0 (and finite)"),
    (dict(z_loss_coef=-0.5), "router.z_loss_coef=-0.5 must be >= 0 (and finite)"),
    (dict(jitter=1.0), "router.jitter=1.0 must be in [0.0, 1.0)"),
    (dict(jitter=-0.1), "router.jitter=-0.1 must be in [0.0, 1.0)"),
    (dict(capacity_factor=0.0), "router.capacity_factor=0.0 must be > 0 (and finite)"),
])
def test_router_config_check_names_the_bad_option(fields, message):
    _refused(RouterConfig(**fields), 4, message)


@pytest.mark.parametrize("fields", [
    dict(top_k=4), dict(top_k=2, drop_experts=[0, 1]), dict(aux_loss_coef=0.0, z_loss_coef=0.0),
    dict(jitter=0.0), dict(jitter=0.5), dict(capacity_factor=None), dict(capacity_factor=0.5), dict(temperature=1e-3),
])
def test_router_config_check_accepts_the_bounds(fields):
    RouterConfig(**fields).check(4)  # must not raise


@pytest.mark.parametrize("fields, message", [
    (dict(n_groups=0), "router.n_groups=0 must be > 0 (and finite)"),
    (dict(n_groups=3), "model.n_experts=8 must be divisible by router.n_groups=3"),
    (dict(n_groups=2, group_score_top=0),
     "router.group_score_top=0 must be in [1, the 4 experts of a group (model.n_experts / router.n_groups)]"),
    (dict(n_groups=2, group_score_top=5),
     "router.group_score_top=5 must be in [1, the 4 experts of a group (model.n_experts / router.n_groups)]"),
    (dict(n_groups=2, topk_groups=0), "router.topk_groups=0 must be in [1, router.n_groups=2]"),
    (dict(n_groups=2, topk_groups=3), "router.topk_groups=3 must be in [1, router.n_groups=2]"),
    (dict(top_k=9), "router.top_k=9 must be <= model.n_experts=8"),  # the base checks run first
])
def test_group_limited_check_names_the_bad_option(fields, message):
    _refused(GroupLimitedConfig(**fields), 8, message)


@pytest.mark.parametrize("fields", [
    dict(n_groups=1), dict(n_groups=8, group_score_top=1, topk_groups=8), dict(n_groups=2, group_score_top=4),
    dict(n_groups=2, topk_groups=2), dict(n_groups=4, group_score_top=2, topk_groups=1),
])
def test_group_limited_check_accepts_the_bounds(fields):
    GroupLimitedConfig(**fields).check(8)  # must not raise


def test_check_model_reads_the_models_expert_count():
    class Model:
        n_experts = 2
    RouterConfig(top_k=2).check_model(Model())
    with pytest.raises(ConfigError, match=r"^router\.top_k=3 must be <= model\.n_experts=2$"):
        RouterConfig(top_k=3).check_model(Model())
