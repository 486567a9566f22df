"""The server's side of expert offloading: the --expert-cache-* flags become the engine option,
and an offloaded engine's stats appear on /metrics (rendered from a real engine's `stats()`)."""

from __future__ import annotations

import pytest

from moe.engine import LLM, SamplingParams
from moe.errors import ConfigError
from moe.serve.__main__ import build_parser, expert_cache_option
from moe.serve.metrics import ServerMetrics
from tests.engine.conftest import build_model


def test_flags_make_the_engine_option():
    args = build_parser().parse_args(["ckpt", "--expert-cache-memory", "8GB", "--expert-cache-policy", "lookahead"])
    assert expert_cache_option(args) == {"memory": "8GB", "policy": "lookahead"}
    assert expert_cache_option(build_parser().parse_args(["ckpt"])) is None
    with pytest.raises(ConfigError, match="--expert-cache-policy / --expert-cache-dir need"):
        expert_cache_option(build_parser().parse_args(["ckpt", "--expert-cache-policy", "lfu"]))


def test_metrics_show_the_cache():
    llm = LLM.from_model(build_model(260), num_blocks=16, expert_cache={"experts_per_layer": 2, "policy": "lfu"})
    llm.generate([[5, 6, 7, 8, 9]], SamplingParams(temperature=0.0, max_tokens=3))
    stats = llm.stats()
    text = ServerMetrics().render(stats, 0)
    assert f'_expert_cache{{key="hit_rate"}} {stats["offload/hit_rate"]}' in text
    assert '_expert_cache_layer_hit_rate{layer="1"}' in text and stats["offload/uses"] > 0
