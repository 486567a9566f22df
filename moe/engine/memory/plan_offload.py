"""The memory plan with expert offloading (`python -m moe.engine.memory.plan ... --expert-cache X`):
the device keeps every weight but the routed experts, plus `experts_per_layer` expert slots in
each MoE layer; the experts themselves go to the slow tier (pinned host memory on a GPU, a
memory-mapped file on a CPU-only machine), and what the device saves goes to the KV cache.

    python -m moe.engine.memory.plan mixtral-8x7b/config.json --device-memory 24GB --expert-cache 2
    ... --expert-cache 8GB                                   # a byte budget for all slots
    ... --expert-cache '{"experts_per_layer": 4, "policy": "lookahead"}'
"""

from __future__ import annotations

import dataclasses
import json

import torch

from moe.config.schema import ModelConfig
from moe.engine.memory.memory_profile import MemoryPlan, gib
from moe.engine.offload.attach import check_offloadable, moe_layers, slots_per_layer
from moe.engine.offload.options import ExpertCacheConfig
from moe.engine.offload.stored import expert_nbytes
from moe.engine.memory.plan_quant import planned_model
from moe.errors import ConfigError
from moe.quant import NONE


def expert_cache_option(text: str) -> ExpertCacheConfig:
    """`--expert-cache`: N (experts per layer), a size (8GB) or a JSON object of expert_cache options."""
    text = str(text).strip()
    if text.isdigit():
        return ExpertCacheConfig(experts_per_layer=int(text))
    if text.startswith("{"):
        try:
            return ExpertCacheConfig.coerce(json.loads(text))
        except json.JSONDecodeError as e:
            raise ConfigError(f"--expert-cache {text!r} is not a JSON object ({e})") from None
    return ExpertCacheConfig(memory=text)


def plan_with_expert_cache(plan: MemoryPlan, cfg: ModelConfig, dtype: torch.dtype, option: str, quant: str = NONE):
    """`(plan, facts)`: the plan with the routed experts off the device but their slots, and the
    offload's own figures (slots, residency, fast- and slow-tier bytes). With `quant`, the experts
    and their slots are counted at the scheme's stored bytes (the offload moves codes and scales)."""
    expert_cache = expert_cache_option(option)
    model = planned_model(cfg, dtype, quant)
    layers = moe_layers(model)
    check_offloadable(layers)
    first = next(iter(layers.values())).experts
    expert_bytes = expert_nbytes(first, dtype)  # weights and any biases (GPT-OSS)
    top_k = max(m.router.top_k for m in layers.values())
    slots = slots_per_layer(expert_cache, len(layers), expert_bytes, top_k, first.n_experts)
    all_experts = sum(expert_nbytes(m.experts, dtype) * m.experts.n_experts for m in layers.values())
    fast = slots * expert_bytes * len(layers)
    facts = dict(expert_cache_experts_per_layer=slots, expert_cache_residency=slots / first.n_experts,
                 expert_cache_fast_tier_bytes=fast, expert_cache_slow_tier_bytes=all_experts,
                 expert_cache_policy=expert_cache.policy)
    return dataclasses.replace(plan, weights=plan.weights - all_experts + fast), facts


def offload_lines(facts: dict) -> list[str]:
    return [f"expert cache           {facts['expert_cache_experts_per_layer']} experts per MoE layer "
            f"({100 * facts['expert_cache_residency']:.1f}% resident, policy {facts['expert_cache_policy']}): "
            f"{gib(facts['expert_cache_fast_tier_bytes'])} of slots counted in the weights above",
            f"slow tier (host)       {gib(facts['expert_cache_slow_tier_bytes'])} of routed experts in pinned host "
            "memory (GPU) or a memory-mapped file (CPU)"]
