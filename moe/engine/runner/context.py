"""The kv context the model's attention calls: it owns the paged KV cache of every layer.

The engine runs one flattened sequence per step: `input_ids [1, N]` holding the decode tokens
of some sequences followed by the prefill chunks of others, with explicit positions. For each
layer the model hands `attend` its rotary-embedded `q [1, H, N, d]` and `k, v [1, G, N, d]`;
the context writes k/v into the cache slots of those tokens, then runs the backend's decode
kernel on the first `num_decodes` rows (one query per sequence) and its varlen prefill kernel
on the rest (`cu_seqlens_q`), each sequence seeing its cached prefix and itself causally.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


class PagedKVContext:
    def __init__(self, n_layers: int, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, backend: PagedAttentionBackend,
                 kv_cache_dtype: str = "auto"):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.backend, self.dtype = backend, dtype
        self.scale = 1.0 / math.sqrt(head_dim)
        # kv_cache_dtype="fp8_e4m3": E4M3 codes + per-(token, head) scales (moe/engine/runner/kv_fp8.py)
        self.fp8 = FP8KVCache(n_layers, num_blocks, block_size, n_kv_heads, head_dim, device) \
            if kv_cache_dtype == "fp8_e4m3" else None
        # One allocation; per-layer views [num_blocks, block_size, n_kv_heads, head_dim].
        shape = (n_layers, 2, num_blocks, block_size, n_kv_heads, head_dim) if self.fp8 is None else (n_layers, 2, 0)
        self.kv = torch.zeros(*shape, dtype=dtype, device=device)
        self.k_caches = [self.kv[i, 0] for i in range(n_layers)]
        self.v_caches = [self.kv[i, 1] for i in range(n_layers)]
        self.meta: AttentionMetadata | None = None

    @staticmethod
    def bytes_per_block(n_layers: int, block_size: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype,
                        kv_cache_dtype: str = "auto") -> int:
        if kv_cache_dtype == "fp8_e4m3":
            return fp8_bytes_per_block(n_layers, block_size, n_kv_heads, head_dim)
        return 2 * n_layers * block_size * n_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def attend(self, layer_idx: int, q_BHTd: torch.Tensor, k_BGTd: torch.Tensor, v_BGTd: torch.Tensor,
               window=None, sinks_H=None) -> torch.Tensor:
        meta = self.meta
        if meta is None:
            raise RuntimeError("PagedKVContext.attend called outside an engine step (no batch metadata set)")
        if q_BHTd.shape[0] != 1:
            raise ValueError(f"the engine flattens a step into one row; got a batch of {q_BHTd.shape[0]}")
        q = q_BHTd[0].transpose(0, 1)  # [N, H, d] (a view)
        k = k_BGTd[0].transpose(0, 1)
        v = v_BGTd[0].transpose(0, 1)
        be = self.backend
        nd, N = meta.num_decodes, q.shape[0]
        decode_tables, prefill_tables = meta.decode_block_tables, meta.prefill_block_tables
        if self.fp8 is None:
            k_cache, v_cache = self.k_caches[layer_idx], self.v_caches[layer_idx]
            be.write(k, v, k_cache, v_cache, meta.slot_mapping)
        else:  # write E4M3, then attend over the step's blocks dequantised (moe/engine/runner/kv_fp8.py)
            self.fp8.write(layer_idx, k, v, meta.slot_mapping)
            k_cache, v_cache, (decode_tables, prefill_tables) = self.fp8.compact(
                layer_idx, [decode_tables, prefill_tables], q.dtype)
        parts = []
        if nd:
            parts.append(be.decode(q[:nd], k_cache, v_cache, decode_tables, meta.decode_context_lens, self.scale,
                                   window, sinks_H))
        if nd < N:
            parts.append(be.prefill(q[nd:], k_cache, v_cache, prefill_tables, meta.prefill_cu_seqlens_q,
                                    meta.prefill_context_lens, self.scale, meta.prefill_max_seqlen_q, window, sinks_H))
        o = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        return o.transpose(0, 1).unsqueeze(0)  # [1, H, N, d]
