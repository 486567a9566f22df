"""The kv context the model's attention calls: it owns the paged KV cache of every layer.

The engine runs one flattened sequence per step: `input_ids [1, N]` holding the decode tokens
of some sequences followed by the prefill chunks of others, with explicit positions. For each
layer the model hands `attend` its rotary-embedded `q [1, H, N, d]` and `k, v [1, G, N, d]`;
the context writes k/v into the cache slots of those tokens, then runs the backend's decode
kernel on the first `num_decodes` rows (one query per sequence) and its varlen prefill kernel
on the rest (`cu_seqlens_q`), each sequence seeing its cached prefix and itself causally.

Multi-head Latent Attention (`model.attention_kind=mla`) caches one latent row per token and layer
(`KVLayout.latent`): the normalised `kv_lora_rank` latent and the rotary key, `[num_blocks,
block_size, 1, kv_lora_rank + qk_rope_head_dim]`, held once and read as both K and V. The layer
passes `attend` its `LatentAttention` (`mla=`, moe/attention/mla_paged.py): the context writes the
step's rows as for any layer (FP8 included), then hands it the cache and the step's tables; it
decodes absorbed (kernels/mla_decode on CUDA) and prefills expanded or absorbed (the cheaper), so
prefix caching, chunked prefill, preemption and speculative decoding work on it unchanged.

A hybrid model (full and sliding layers; `layout`: moe.engine.memory.kv_groups.cache_layout, which
the engine passes in: the runner imports nothing of moe.engine.memory)
keeps `layers_per_block` layer slots per block, layer i in slot `layer_slot[i]`, and its step
metadata carries one `AttentionMetadata` per KV cache group (`groups`: slot mapping and tables of
that group's block tables); `attend` hands each layer its group's, so the attention backends see
an ordinary block table per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from moe.attention import PagedAttentionBackend
from moe.engine.runner.kv_fp8 import FP8KVCache, fp8_bytes_per_block


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [N] int64: cache slot of each new token
    num_decodes: int  # the first num_decodes tokens are decodes (one per sequence)
    # decode part: one row per decode sequence
    decode_block_tables: torch.Tensor  # [num_decodes, max_blocks] int32
    decode_context_lens: torch.Tensor  # [num_decodes] int32
    # prefill part: the remaining sequences
    prefill_block_tables: torch.Tensor  # [num_prefills, max_blocks] int32
    prefill_context_lens: torch.Tensor  # [num_prefills] int32 (cached + new tokens)
    prefill_cu_seqlens_q: torch.Tensor  # [num_prefills + 1] int32, starting at 0
    prefill_max_seqlen_q: int
    # a hybrid cache: the metadata of each KV cache group (this one is group 0's); None: one group
    groups: Optional[list["AttentionMetadata"]] = None
    # the backend's `plan_decode` of the decode tables: made at the step's first decoding layer, reused by the rest
    decode_plan: Any = None
    # the backend's `plan_write` of slot_mapping: made at the step's first layer, reused by the rest
    write_plan: Any = None


@dataclass(frozen=True)
class KVLayout:
    """What one token of one layer keeps: `n_kv_heads` rows of `head_dim`, as K and V (two
    tensors), or with `latent` one tensor read as both (MLA's latent + rotary key, one row)."""
    n_kv_heads: int
    head_dim: int
    latent: bool = False

    @property
    def tensors(self) -> int:
        return 1 if self.latent else 2

    @staticmethod
    def of(cfg: Any) -> "KVLayout":
        if cfg.attention_kind == "mla":
            return KVLayout(1, cfg.kv_lora_rank + cfg.qk_rope_head_dim, latent=True)
        return KVLayout(cfg.n_kv_heads, cfg.resolved_head_dim)


class PagedKVContext:
    def __init__(self, n_layers: int, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, backend: PagedAttentionBackend,
                 kv_cache_dtype: str = "auto", latent: bool = False, layout=None):
        """`layout` (a `CacheLayout`): where each of the `n_layers` layers lives (a hybrid model's
        per-group slots); None: layer i in slot i, one group."""
        self.num_blocks, self.block_size = num_blocks, block_size
        self.num_groups = len(layout.groups) if layout is not None else 1
        self.layer_slot = layout.layer_slot if layout is not None else tuple(range(n_layers))
        self.layer_group = layout.layer_group if self.num_groups > 1 else None
        n_slots = layout.layers_per_block if layout is not None else n_layers
        self.backend, self.dtype, self.latent = backend, dtype, latent
        self.scale = 1.0 / math.sqrt(head_dim)
        n = 1 if latent else 2  # a latent cache is one tensor, read as K and as V
        # kv_cache_dtype="fp8_e4m3": E4M3 codes + per-(token, head) scales (moe/engine/runner/kv_fp8.py)
        self.fp8 = FP8KVCache(n_slots, num_blocks, block_size, n_kv_heads, head_dim, device, n) \
            if kv_cache_dtype == "fp8_e4m3" else None
        # One allocation; per-layer views [num_blocks, block_size, n_kv_heads, head_dim].
        shape = (n_slots, n, num_blocks, block_size, n_kv_heads, head_dim) if self.fp8 is None else (n_slots, n, 0)
        self.kv = torch.zeros(*shape, dtype=dtype, device=device)
        self.k_caches = [self.kv[j, 0] for j in self.layer_slot]
        self.v_caches = self.k_caches if latent else [self.kv[j, 1] for j in self.layer_slot]
        self.meta: AttentionMetadata | None = None
        self._derived: dict = {}

    @classmethod
    def for_model(cls, cfg: Any, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device,
                  backend: PagedAttentionBackend, kv_cache_dtype: str = "auto", layout=None) -> "PagedKVContext":
        """The cache of a model of `cfg` in its layout (`KVLayout.of`); `layout`: per KV cache group."""
        lay = KVLayout.of(cfg)
        return cls(cfg.n_layers, num_blocks, block_size, lay.n_kv_heads, lay.head_dim, dtype, device, backend,
                   kv_cache_dtype, lay.latent, layout)

    @staticmethod
    def bytes_per_block(n_layers: int, block_size: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype,
                        kv_cache_dtype: str = "auto", latent: bool = False) -> int:
        n = 1 if latent else 2
        if kv_cache_dtype == "fp8_e4m3":
            return fp8_bytes_per_block(n_layers, block_size, n_kv_heads, head_dim, n)
        return n * n_layers * block_size * n_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    @staticmethod
    def model_bytes_per_block(cfg: Any, block_size: int, dtype: torch.dtype, kv_cache_dtype: str = "auto",
                              layers_per_block: Optional[int] = None) -> int:
        """`bytes_per_block` of a model of `cfg` in its layout (MLA: the latent row); a block holds
        every layer, or `layers_per_block` (a hybrid layout: one layer of each KV cache group per slot)."""
        lay = KVLayout.of(cfg)
        n_slots = cfg.n_layers if layers_per_block is None else layers_per_block
        return PagedKVContext.bytes_per_block(n_slots, block_size, lay.n_kv_heads, lay.head_dim, dtype,
                                              kv_cache_dtype, lay.latent)

    def derived(self, key: Any, build: Callable[[], torch.Tensor]) -> torch.Tensor:
        """A tensor computed once per engine from the served (fixed) weights, e.g. MLA's absorbed
        projections of a quantized layer; `build` runs on the first call for `key`."""
        if key not in self._derived:
            self._derived[key] = build()
        return self._derived[key]

    def attend(self, layer_idx: int, q_BHTd: torch.Tensor, k_BGTd: torch.Tensor, v_BGTd: torch.Tensor,
               window=None, sinks_H=None, mla=None) -> torch.Tensor:
        meta = self.meta
        if meta is None:
            raise RuntimeError("PagedKVContext.attend called outside an engine step (no batch metadata set)")
        if meta.groups is not None:  # a hybrid cache: this layer's group's slots and tables
            meta = meta.groups[self.layer_group[layer_idx]]
        if q_BHTd.shape[0] != 1:
            raise ValueError(f"the engine flattens a step into one row; got a batch of {q_BHTd.shape[0]}")
        q = q_BHTd[0].transpose(0, 1)  # [N, H, d] (a view)
        k = k_BGTd[0].transpose(0, 1)
        v = v_BGTd[0].transpose(0, 1)
        be = self.backend
        nd, N = meta.num_decodes, q.shape[0]
        decode_tables, prefill_tables = meta.decode_block_tables, meta.prefill_block_tables
        if self.latent and v_BGTd is not k_BGTd:
            raise ValueError("a latent KV cache (MLA) holds one tensor: attend(layer, q, kv, kv) with v the same as k")
        if self.fp8 is None:
            k_cache, v_cache = self.k_caches[layer_idx], self.v_caches[layer_idx]  # (views of its slot)
            wplan = meta.write_plan
            if wplan is None:
                wplan = meta.write_plan = be.plan_write(meta.slot_mapping)
            if wplan is None:
                be.write(k, v, k_cache, v_cache, meta.slot_mapping)  # (latent: k_cache is v_cache, one write twice)
            else:
                be.write(k, v, k_cache, v_cache, meta.slot_mapping, plan=wplan)
        else:  # write E4M3, then attend over the step's blocks dequantised (moe/engine/runner/kv_fp8.py)
            slot = self.layer_slot[layer_idx]
            self.fp8.write(slot, k, None if self.latent else v, meta.slot_mapping)
            k_cache, v_cache, (decode_tables, prefill_tables) = self.fp8.compact(
                slot, [decode_tables, prefill_tables], q.dtype)
        if mla is not None:  # an MLA layer on its latent cache attends its own way (moe/attention/mla_paged.py)
            return mla(be, q, k_cache, meta, decode_tables, prefill_tables).transpose(0, 1).unsqueeze(0)
        parts = []
        if nd:
            plan = None
            if self.fp8 is None:  # (FP8: each layer's tables are its own compacted ones)
                plan = meta.decode_plan
                if plan is None:
                    plan = be.plan_decode(decode_tables, meta.decode_context_lens, self.block_size)
                    if plan is not None:
                        meta.decode_plan = plan
            parts.append(be.decode(q[:nd], k_cache, v_cache, decode_tables, meta.decode_context_lens, self.scale,
                                   window, sinks_H, plan=plan))
        if nd < N:
            parts.append(be.prefill(q[nd:], k_cache, v_cache, prefill_tables, meta.prefill_cu_seqlens_q,
                                    meta.prefill_context_lens, self.scale, meta.prefill_max_seqlen_q, window, sinks_H))
        o = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        return o.transpose(0, 1).unsqueeze(0)  # [1, H, N, d]
