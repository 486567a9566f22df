"""KV cache groups: which layers share one block table, and what a sequence of a group must keep.

After vLLM v1's hybrid KV cache manager, layers are grouped by attention type: the full-attention
layers form one group, the sliding-window layers of each window another (docs/design/model.md).
A sliding group needs only the blocks its window can still see: a query at position p reads keys
p - window + 1 .. p, so once the next position to compute is p, every block whose last position is
older than p - window + 1 can be freed.

What the engine builds: a model of one group (every layer full, or every layer sliding with one
window) keeps one KV tensor over all layers (a block id names the same slots in every layer) and
one table per sequence; a sliding one frees what the window passed (`BlockManager(sliding_window=
...)`; `engine_window`). A hybrid model (several groups: GPT-OSS's alternating sliding and full
layers) is served in vLLM's layout (`cache_layout`): one shared pool whose block holds the K/V of
`layers_per_block` layers, one layer of each group per slot index, and one block table per group
and sequence (moe.engine.memory.hybrid_blocks); layer i reads slot `layer_slot[i]` of the blocks
its group's table names. The window groups' released blocks so serve the full group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class KVCacheGroup:
    window: Optional[int]  # sliding window in positions; None: full attention
    layers: tuple[int, ...]


def kv_cache_groups(cfg: Any) -> list[KVCacheGroup]:
    """The model's layers grouped by attention type (full first, then one group per window)."""
    by_window: dict[Optional[int], list[int]] = {}
    for i in range(cfg.n_layers):
        by_window.setdefault(cfg.layer_window(i), []).append(i)
    order = sorted(by_window, key=lambda w: (w is not None, w or 0))
    return [KVCacheGroup(w, tuple(by_window[w])) for w in order]


def engine_window(cfg: Any) -> Optional[int]:
    """The window by which the engine's block manager frees blocks: the model's when it has one
    group and that group slides, else None (full attention, or hybrid: see the module docstring)."""
    groups = kv_cache_groups(cfg)
    return groups[0].window if len(groups) == 1 else None


def blocks_held(num_tokens: int, block_size: int, window: Optional[int], max_chunk: Optional[int] = None) -> int:
    """The most blocks one sequence of `num_tokens` tokens holds at once. Full attention: all of
    them. A window: a step computing n new tokens from position p keeps positions p - window + 1
    .. p + n - 1 (window - 1 + n positions, spanning at most ceil((window - 1 + n + block_size - 1)
    / block_size) blocks), n at most `max_chunk` (default: the whole sequence in one step)."""
    every = -(-num_tokens // block_size)
    if window is None:
        return every
    n = num_tokens if max_chunk is None else min(max_chunk, num_tokens)
    return min(every, -(-(window - 1 + n + block_size - 1) // block_size))


def is_hybrid(cfg: Any) -> bool:
    """Whether the model has more than one KV cache group (full and sliding layers, or two windows)."""
    return len(kv_cache_groups(cfg)) > 1


@dataclass(frozen=True)
class CacheLayout:
    """Where each layer's K/V live in the paged cache. One group: layer i is slot i of every block
    (`layers_per_block` = n_layers). Hybrid: a block holds `layers_per_block` = the largest group's
    layer count, and layer i is slot `layer_slot[i]` (its index within group `layer_group[i]`) of
    the blocks its group's table names. Groups of unequal size leave the smaller groups' blocks
    partly unused (padding: a 5:1 sliding:full model wastes 4/5 of each full-group block; vLLM
    splits the larger groups into pages of the smaller size instead: not built)."""
    groups: tuple[KVCacheGroup, ...]
    layer_group: tuple[int, ...]
    layer_slot: tuple[int, ...]
    layers_per_block: int

    @property
    def windows(self) -> list[Optional[int]]:
        return [g.window for g in self.groups]


def cache_layout(cfg: Any, hybrid: bool) -> CacheLayout:
    """The engine's layout of `cfg`'s cache: per group (`hybrid`, for a model `is_hybrid`) or one."""
    n = cfg.n_layers
    if not hybrid:
        one = KVCacheGroup(engine_window(cfg), tuple(range(n)))
        return CacheLayout((one,), (0,) * n, tuple(range(n)), n)
    groups = tuple(kv_cache_groups(cfg))
    group_of, slot_of = [0] * n, [0] * n
    for g, grp in enumerate(groups):
        for j, layer in enumerate(grp.layers):
            group_of[layer], slot_of[layer] = g, j
    return CacheLayout(groups, tuple(group_of), tuple(slot_of), max(len(g.layers) for g in groups))
