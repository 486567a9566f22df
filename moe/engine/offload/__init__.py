"""Expert offloading (`expert_cache=`): the slow tier (`slow_tier.py`), per-layer fast-tier
caches (`cache.py`) behind the eviction policies of `policies.py`, the experts module that runs
on them (`experts.py`), lookahead prefetch (`prefetch.py`), stats (`stats.py`) and the engine's
entry, `ExpertOffload.attach` (`attach.py`). docs/guides/offload.md."""

from moe.engine.offload.options import ExpertCacheConfig
from moe.engine.offload.policies import CACHE_POLICIES

__all__ = ["CACHE_POLICIES", "ExpertCacheConfig"]
