"""`expert_cache=`: the engine option that serves a model's routed experts from a slow tier
through a fast tier of a few expert slots per MoE layer (docs/guides/offload.md).

    LLM(path, expert_cache={"experts_per_layer": 2})                  # 2 slots per MoE layer, LRU
    LLM(path, expert_cache={"memory": "8GB", "policy": "lookahead"})  # slots sized from a byte budget

Checked here without the model (field names, types, the policy name); what needs the model (a
budget below router.top_k, a dense model) is checked when the engine builds the cache.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, fields
from typing import Optional, Union

from moe.engine.offload.policies import CACHE_POLICIES
from moe.errors import ConfigError, check_option_names

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(v: Union[int, str], field: str) -> int:
    """`8GB`, `512MiB`, `1.5GB` or an int of bytes."""
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return v
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", v) if isinstance(v, str) else None
    if m is None or m.group(2).upper() not in _UNITS or float(m.group(1)) <= 0:
        raise ConfigError(f"{field}={v!r} must be a positive byte count: an int or a string such as "
                          f"'8GB' or '512MiB' (units {[u for u in _UNITS if u]})")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


@dataclass
class ExpertCacheConfig:
    experts_per_layer: Optional[int] = None  # fast-tier slots per MoE layer
    memory: Optional[Union[int, str]] = None  # or a byte budget for all layers' slots together
    policy: str = "lru"  # a CACHE_POLICIES name: lru | lfu | lookahead | ondemand
    dir: Optional[str] = None  # where the slow tier's safetensors file goes (None: a temporary directory)

    def __post_init__(self):
        if (self.experts_per_layer is None) == (self.memory is None):
            raise ConfigError("expert_cache needs exactly one of 'experts_per_layer' (slots per MoE layer) "
                              f"or 'memory' (e.g. '8GB'); got experts_per_layer={self.experts_per_layer!r}, "
                              f"memory={self.memory!r}")
        v = self.experts_per_layer
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ConfigError(f"expert_cache.experts_per_layer={v!r} must be a positive int")
        if self.memory is not None:
            self.memory = parse_bytes(self.memory, "expert_cache.memory")
        if not isinstance(self.policy, str):
            raise ConfigError(f"expert_cache.policy={self.policy!r} must be one of {sorted(CACHE_POLICIES)}")
        CACHE_POLICIES.lookup(self.policy)  # the registry names the allowed values
        if self.dir is not None and (not isinstance(self.dir, (str, os.PathLike)) or not str(self.dir)):
            raise ConfigError(f"expert_cache.dir={self.dir!r} must be a directory path or None")

    @classmethod
    def coerce(cls, v) -> Optional["ExpertCacheConfig"]:
        if v is None or isinstance(v, cls):
            return v
        if not isinstance(v, dict):
            raise ConfigError(f"expert_cache={v!r} must be a dict such as {{'experts_per_layer': 2}} or "
                              "{'memory': '8GB', 'policy': 'lookahead'}, or None")
        check_option_names(v, [f.name for f in fields(cls)], "expert_cache")
        return cls(**v)
