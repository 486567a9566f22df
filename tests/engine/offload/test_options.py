"""`expert_cache=`: bad values and unsupported combinations are one ConfigError naming the field."""

from __future__ import annotations

import copy

import pytest

from moe.engine import LLM
from moe.engine.config import EngineConfig
from moe.engine.offload.attach import slots_per_layer
from moe.engine.offload.options import ExpertCacheConfig, parse_bytes
from moe.errors import ConfigError
from tests.engine.conftest import build_model


@pytest.fixture(scope="module")
def model():
    return build_model(260)


@pytest.mark.parametrize("opts, words", [
    ({}, "exactly one of"),
    ({"experts_per_layer": 2, "memory": "1GB"}, "exactly one of"),
    ({"experts_per_layer": 0}, "experts_per_layer=0"),
    ({"memory": "lots"}, "expert_cache.memory='lots'"),
    ({"experts_per_layer": 2, "policy": "fifo"}, "expert_cache.policy='fifo' is unknown"),
    ({"experts_per_layer": 2, "size": 3}, "unknown expert_cache option(s) ['size']"),
])
def test_bad_options_name_the_field(opts, words):
    with pytest.raises(ConfigError) as e:
        EngineConfig(expert_cache=opts)
    assert words in str(e.value)


def test_memory_sizes():
    assert parse_bytes("8GB", "m") == 8 * 10**9 and parse_bytes("512MiB", "m") == 512 * 2**20
    assert parse_bytes("1.5kb", "m") == 1500 and parse_bytes(4096, "m") == 4096
    cfg = ExpertCacheConfig(memory="1MB")
    # 10**6 bytes over 2 layers of 10_000-byte experts: 50 per layer, capped at the 8 experts there are
    assert slots_per_layer(cfg, 2, 10_000, 2, 8) == 8
    assert slots_per_layer(ExpertCacheConfig(memory=60_000), 2, 10_000, 2, 8) == 3


def test_budget_below_top_k(model):
    with pytest.raises(ConfigError, match=r"expert_cache.experts_per_layer=1 is below router.top_k=2"):
        LLM.from_model(copy.deepcopy(model), num_blocks=8, expert_cache={"experts_per_layer": 1})
    with pytest.raises(ConfigError, match=r"expert_cache.memory=100 bytes .* is below router.top_k=2"):
        LLM.from_model(copy.deepcopy(model), num_blocks=8, expert_cache={"memory": 100})


def test_dense_model_refused():
    dense = build_model(260, n_dense_layers=2)
    with pytest.raises(ConfigError, match="no MoE layer"):
        LLM.from_model(dense, num_blocks=8, expert_cache={"experts_per_layer": 2})


def test_combinations_refused_naming_both(model):
    with pytest.raises(ConfigError, match="expert_cache is not supported with compile=True"):
        EngineConfig(compile=True, expert_cache={"experts_per_layer": 2})
    # quantized and biased (GPT-OSS) experts are served: tests/engine/offload/test_stored.py, test_biased.py
