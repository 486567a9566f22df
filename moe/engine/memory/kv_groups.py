"""KV cache groups: which layers share one block table, and what a sequence of a group must keep.

After vLLM v1's hybrid KV cache manager, layers are grouped by attention type: the full-attention
layers form one group, the sliding-window layers of each window another (docs/design/model.md).
A sliding group needs only the blocks its window can still see: a query at position p reads keys
p - window + 1 .. p, so once the next position to compute is p, every block whose last position is
older than p - window + 1 can be freed.

What the engine builds today: the KV cache is one tensor over all layers (a block id names the
same slots in every layer), so a block can be freed only when no layer of the model still reads
it. A model whose layers all slide with one window is one sliding group: its block manager frees
what the window passed (`BlockManager(sliding_window=...)`). A hybrid model (full and sliding
layers) is served with one table and frees nothing: its full layers need every block, and freeing
the sliding layers' share needs vLLM's layer-sharing layout (a block = one layer of each group,
per-group block tables), not built yet. `engine_window` says which case a config is.
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
