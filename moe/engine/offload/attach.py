"""`ExpertOffload.attach(model, cfg, device, dtype)`: move a loaded model's routed experts to the
slow tier and put an `OffloadedExperts` in place of each MoE layer's experts module (attention,
norms, routers and shared experts stay resident). The engine keeps the returned handle for
`stats()` and closes it with the engine.

The model must be on the host when attached (the LLM loads it there): its expert tensors are
written to the slow tier and then let go; the rest moves to the device with the engine.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
import weakref

import torch

from moe.engine.offload.cache import LayerExpertCache
from moe.engine.offload.experts import OffloadedExperts
from moe.engine.offload.options import ExpertCacheConfig
from moe.engine.offload.policies import CACHE_POLICIES
from moe.engine.offload.prefetch import LookaheadPrefetcher
from moe.engine.offload.slow_tier import SlowTier, write_slow_tier
from moe.engine.offload.stats import engine_summary
from moe.engine.offload.stored import check_experts, expert_nbytes, expert_tensors
from moe.errors import ConfigError
from moe.moe_layer import MoE


def moe_layers(model) -> dict[int, MoE]:
    return {i: block.ffn for i, block in enumerate(model.layers) if isinstance(block.ffn, MoE)}


def slots_per_layer(cfg: ExpertCacheConfig, n_layers: int, expert_bytes: int, top_k: int, n_experts: int) -> int:
    """The fast tier's slots per MoE layer; below the router's top_k is a ConfigError (a token
    needs its top_k experts of a layer at once)."""
    if cfg.experts_per_layer is not None:
        n, field = cfg.experts_per_layer, f"expert_cache.experts_per_layer={cfg.experts_per_layer}"
    else:
        n = cfg.memory // (n_layers * expert_bytes)
        field = (f"expert_cache.memory={cfg.memory} bytes ({n} experts of {expert_bytes} bytes in each of "
                 f"{n_layers} MoE layers)")
    if n < top_k:
        raise ConfigError(f"{field} is below router.top_k={top_k}: each token needs its {top_k} experts of a "
                          f"layer resident at once; give experts_per_layer >= {top_k} (or memory >= "
                          f"{top_k * n_layers * expert_bytes} bytes)")
    return min(n, n_experts)


def check_offloadable(layers: dict[int, MoE]) -> None:
    if not layers:
        raise ConfigError("expert_cache is set but the model has no MoE layer (a dense model): there are no "
                          "experts to offload; drop expert_cache")
    for i, moe in layers.items():
        check_experts(i, moe.experts)


class ExpertOffload:
    def __init__(self, caches: dict[int, LayerExpertCache], policy: str, prefetcher, cleanup):
        self.caches, self.policy, self.prefetcher, self._cleanup = caches, policy, prefetcher, cleanup
        self.slots = next(iter(caches.values())).n_slots
        self.n_experts = next(iter(caches.values())).n_experts

    @classmethod
    def attach(cls, model, cfg: ExpertCacheConfig, device: torch.device, dtype: torch.dtype) -> "ExpertOffload":
        layers = moe_layers(model)
        check_offloadable(layers)
        first = next(iter(layers.values())).experts
        expert_bytes = expert_nbytes(first, dtype)  # stored bytes (quantized: codes + scales)
        top_k = max(moe.router.top_k for moe in layers.values())
        n_slots = slots_per_layer(cfg, len(layers), expert_bytes, top_k, first.n_experts)
        own_dir = cfg.dir is None
        directory = tempfile.mkdtemp(prefix="moe-expert-cache-") if own_dir else str(cfg.dir)
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"experts-{uuid.uuid4().hex[:8]}.safetensors")
        write_slow_tier(path, {i: expert_tensors(m.experts, dtype) for i, m in layers.items()})
        slow = SlowTier(path, pin=device.type == "cuda")
        policy_cls = CACHE_POLICIES.lookup(cfg.policy)
        caches = {i: LayerExpertCache(i, slow, n_slots, policy_cls(), device) for i in layers}
        for i, moe in layers.items():  # the resident expert tensors are let go here
            moe.experts = OffloadedExperts(caches[i], moe.experts, policy_cls.keeps)
        prefetcher = LookaheadPrefetcher(model, caches, device) if policy_cls.prefetches else None
        cleanup = weakref.finalize(slow, _remove, path, directory if own_dir else None)
        return cls(caches, cfg.policy, prefetcher, cleanup)

    def stats(self) -> dict:
        return engine_summary({i: c.stats for i, c in self.caches.items()}, self.policy, self.slots, self.n_experts)

    def reset_stats(self) -> None:
        for c in self.caches.values():
            c.stats.reset()

    def close(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.close()


def _remove(path: str, directory) -> None:
    """The slow tier's file goes with the engine (the mapping keeps its pages until then)."""
    try:
        os.remove(path)
    except OSError:
        pass
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
