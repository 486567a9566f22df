"""KV bytes of one sequence per KV cache group, for the memory plan (`--kv-groups engine|per-group`).

A model's layers group by attention type (moe.engine.memory.kv_groups): full-attention layers
need every block of a sequence; a sliding-window group needs only the blocks its window can still
see while a step of up to `max_num_batched_tokens` tokens runs (`kv_groups.blocks_held`). Two
countings of one sequence of `max_model_len` tokens:

    per-group   each group holds its own blocks: full layers at full length, window layers at
                their window (vLLM's hybrid KV cache manager; counted in bytes, each group's blocks
                x its own layers, so a layout that pads groups to one page size needs more)
    engine      what the engine at this commit holds: a model of one group, one block table
                over all layers, freed by `kv_groups.engine_window` (a model whose layers all
                slide with one window frees what the window passed); a hybrid model, one table
                per group in a shared pool whose block holds the largest group's layer count
                (`kv_groups.cache_layout`: a smaller group's blocks are padded); a hybrid model
                under tensor parallelism, one table over all layers, nothing freed (its worker
                ranks build one-table caches)

The two agree on every model that is not hybrid, and on hybrid models whose groups are of equal
size (GPT-OSS). `--kv-groups engine` (the default) plans what the engine does; a hybrid model's
plan prints both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from moe.engine.memory.kv_groups import blocks_held, engine_window, kv_cache_groups
from moe.engine.memory.memory_profile import gib
from moe.errors import ConfigError

ENGINE, PER_GROUP = "engine", "per-group"
ACCOUNTINGS = (ENGINE, PER_GROUP)


@dataclass(frozen=True)
class GroupKV:
    window: Optional[int]  # None: full attention
    n_layers: int
    blocks: int  # blocks one sequence of max_model_len holds at once in this group
    bytes_per_block: int  # this group's layers x block_size tokens

    @property
    def bytes(self) -> int:
        return self.blocks * self.bytes_per_block

    def name(self) -> str:
        return "full attention" if self.window is None else f"sliding window {self.window}"


@dataclass(frozen=True)
class KVGroupsPlan:
    """One sequence's KV under both countings; `accounting` names the one the plan follows."""

    groups: tuple[GroupKV, ...]
    engine_bytes: int  # what the engine's layout holds (the module docstring)
    engine_window: Optional[int]
    engine_per_group: bool  # the engine keeps one table per group (hybrid, one process)
    accounting: str
    max_model_len: int

    @property
    def per_group_bytes(self) -> int:
        return sum(g.bytes for g in self.groups)

    @property
    def hybrid(self) -> bool:
        return len(self.groups) > 1

    @property
    def sequence_bytes(self) -> int:
        return self.per_group_bytes if self.accounting == PER_GROUP else self.engine_bytes

    def sequences(self, kv_cache: int) -> float:
        """Sequences of max_model_len the cache holds at once (0 when it holds none)."""
        return max(0, kv_cache) / self.sequence_bytes

    def fits(self, kv_cache: int) -> bool:
        return kv_cache >= self.sequence_bytes

    def lines(self, kv_cache: int) -> list[str]:
        out = [f"KV of one sequence of {self.max_model_len} tokens, by group ({self.accounting} counting):"]
        for g in self.groups:
            out.append(f"  {g.name():<22} {g.n_layers:>3} layers: {g.blocks} blocks x "
                       f"{g.bytes_per_block / 2**10:.0f} KiB = {gib(g.bytes)}")
        how = ("one table per group, blocks of the largest group's layers" if self.engine_per_group
               else f"one table over all layers, freed by a window of {self.engine_window}" if self.engine_window
               else "one table over all layers, nothing freed")
        out.append(f"  per-group total {gib(self.per_group_bytes)}; the engine at this commit: "
                   f"{gib(self.engine_bytes)} ({how})")
        if self.hybrid and not self.engine_per_group:
            out.append("  (a tensor-parallel engine serves a hybrid model with one table and frees no window block: "
                       + ("this plan counts what it does; --kv-groups per-group counts per-group tables)"
                          if self.accounting == ENGINE else
                          "this plan counts per-group tables, which it does not build)"))
        if self.engine_per_group and self.engine_bytes > self.per_group_bytes:
            out.append("  (the engine's blocks hold the largest group's layer count, so a smaller group's blocks are "
                       "padded: " + ("this plan counts them so; --kv-groups per-group counts without padding)"
                                     if self.accounting == ENGINE else "this plan counts without the padding)"))
        out.append(f"  the cache holds {self.sequences(kv_cache):.1f} such sequences at once")
        return out

    def as_json(self) -> dict:
        return dict(kv_accounting=self.accounting, kv_bytes_per_sequence=self.sequence_bytes,
                    kv_bytes_per_sequence_engine=self.engine_bytes,
                    kv_bytes_per_sequence_per_group=self.per_group_bytes,
                    engine_per_group_tables=self.engine_per_group,
                    kv_groups=[dict(window=g.window, layers=g.n_layers, blocks_per_sequence=g.blocks,
                                    bytes_per_block=g.bytes_per_block, bytes_per_sequence=g.bytes)
                               for g in self.groups])


def kv_groups_plan(cfg, bytes_per_block: Callable[[int], int], block_size: int, max_model_len: int,
                   max_chunk: int, accounting: str = ENGINE, tensor_parallel: bool = False) -> KVGroupsPlan:
    """The plan of `cfg`'s groups. `bytes_per_block(n_layers)`: KV bytes of a block over n layers
    (per device, or per rank of a tensor-parallel engine, which keeps one table: `tensor_parallel`)."""
    if accounting not in ACCOUNTINGS:
        raise ConfigError(f"--kv-groups={accounting!r} is unknown; choose one of {list(ACCOUNTINGS)}")
    groups = tuple(GroupKV(g.window, len(g.layers), blocks_held(max_model_len, block_size, g.window, max_chunk),
                           bytes_per_block(len(g.layers))) for g in kv_cache_groups(cfg))
    window = engine_window(cfg)
    per_group = len(groups) > 1 and not tensor_parallel
    if per_group:  # kv_groups.cache_layout: every group's blocks hold the largest group's layer count
        engine = sum(g.blocks for g in groups) * bytes_per_block(max(g.n_layers for g in groups))
    else:
        engine = blocks_held(max_model_len, block_size, window, max_chunk) * bytes_per_block(cfg.n_layers)
    return KVGroupsPlan(groups, engine, window, per_group, accounting, max_model_len)
