"""`torch` paged backend: the gather-based PyTorch references of `kernels/paged_attention` (any
device, any dtype); the engine's default on CPU."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.paged_attention import (check_attention, check_cu_seqlens, paged_attention_decode_torch,
                                     paged_attention_prefill_torch, reshape_and_cache_torch)
from moe.attention.base import PAGED_BACKENDS, PagedAttentionBackend, allowed_mask, with_sink_column


def paged_attention_prefill_sdpa(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens,
                                 scale: float, window=None, sinks_H=None) -> torch.Tensor:
    """Same as `paged_attention_prefill_torch`, one sequence at a time through PyTorch's fused
    attention (memory O(tokens), not O(seqs x max_q x max_kv)); one host sync. A window is an
    explicit mask, sinks an extra zero key with the sink logit in the mask (`with_sink_column`)."""
    check_attention(q, k_cache, v_cache, block_tables, context_lens, "paged_attention_prefill")
    check_cu_seqlens(q, cu_seqlens_q, context_lens)
    N, H, d = q.shape
    _, bs, G, _ = k_cache.shape
    out = torch.empty_like(q)
    for s, (lo, hi, ctx) in enumerate(zip(cu_seqlens_q[:-1].tolist(), cu_seqlens_q[1:].tolist(),
                                          context_lens.tolist())):
        if hi == lo:
            continue
        blocks = block_tables[s, :-(-ctx // bs)].long()
        k = k_cache[blocks].reshape(-1, G, d)[:ctx].transpose(0, 1).unsqueeze(0)  # [1, G, ctx, d]
        v = v_cache[blocks].reshape(-1, G, d)[:ctx].transpose(0, 1).unsqueeze(0)
        qs = q[lo:hi].transpose(0, 1).unsqueeze(0)  # [1, H, q_len, d]
        qs = qs.to(k.dtype)
        if hi - lo == ctx and window is None and sinks_H is None:
            mask, causal = None, True
        else:  # queries are the last q_len positions: bottom-right aligned causal mask
            mask, causal = allowed_mask(hi - lo, ctx, window, q.device), False
            if sinks_H is not None:
                k, v, mask = with_sink_column(qs, k, v, mask, sinks_H)
        o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                           enable_gqa=H != G)
        out[lo:hi] = o[0].transpose(0, 1).to(q.dtype)
    return out


@PAGED_BACKENDS.register("torch")
class TorchPagedAttention(PagedAttentionBackend):
    """Prefills whose padded score tensor (seqs x heads x max_q x max_kv) would exceed
    `max_padded_scores` elements run one sequence at a time through fused attention instead."""

    name = "torch"
    max_padded_scores = 1 << 24

    def write(self, k, v, k_cache, v_cache, slot_mapping):
        reshape_and_cache_torch(k, v, k_cache, v_cache, slot_mapping)

    def decode(self, q, k_cache, v_cache, block_tables, context_lens, scale, window=None, sinks_H=None):
        return paged_attention_decode_torch(q, k_cache, v_cache, block_tables, context_lens, scale, window, sinks_H)

    def prefill(self, q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, max_seqlen_q,
                window=None, sinks_H=None):
        padded = block_tables.shape[0] * q.shape[1] * max_seqlen_q * block_tables.shape[1] * k_cache.shape[1]
        if padded > self.max_padded_scores:
            return paged_attention_prefill_sdpa(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale,
                                                window, sinks_H)
        return paged_attention_prefill_torch(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale,
                                             max_seqlen_q, window, sinks_H)
