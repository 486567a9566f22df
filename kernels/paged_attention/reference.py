"""Plain PyTorch references of the paged-attention operations (the `*_torch` functions): they
define the semantics the Triton kernels are tested against, run on any device and dtype, and
are what the engine's `torch` paged backend (`moe/attention/paged_torch.py`) calls.

Both attention references take a layer's options: `window` (a query at position p sees only the
keys at positions > p - window, as HF's sliding-window mask) and `sinks_H` (a logit per query
head that joins the softmax denominator and carries no value, GPT-OSS's attention sinks)."""

from __future__ import annotations

from typing import Optional

import torch

from kernels.paged_attention.checks import check_attention, check_cu_seqlens, check_write


def reshape_and_cache_torch(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Reference: `cache.view(-1, G, d)[slot] = k` for every token with slot >= 0."""
    check_write(k, v, k_cache, v_cache, slot_mapping)
    slots, keep = kept_slots(slot_mapping)
    if keep is not None:
        k, v = k[keep], v[keep]
    copy_to_slots(k, v, k_cache, v_cache, slots)


def kept_slots(slot_mapping: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(the int64 slots that are written, the bool mask of those tokens over all of them or None when
    every slot is >= 0): negative slots (padding rows) are dropped. One host read."""
    slots = slot_mapping.long()
    if slots.numel() and bool((slots < 0).any()):
        keep = slots >= 0
        return slots[keep], keep
    return slots, None


def copy_to_slots(k, v, k_cache, v_cache, slots: torch.Tensor) -> None:
    """`cache.view(-1, G, d)[slots] = k` (and v), cast to the cache's dtype; every slot >= 0."""
    G, d = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, G, d).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, G, d).index_copy_(0, slots, v.to(v_cache.dtype))


def gather_cache(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[S, max_blocks * block_size, G, d]: each sequence's cache laid out contiguously."""
    S, B = block_tables.shape
    _, bs, G, d = cache.shape
    return cache.index_select(0, block_tables.reshape(-1).long()).view(S, B * bs, G, d)  # (faster than cache[bt])


def softmax_with_sinks(scores: torch.Tensor, sinks_GR: Optional[torch.Tensor]) -> torch.Tensor:
    """fp32 softmax over the last dim of `scores [S, G, R, ..., L]`; with sinks, each head's
    sink logit joins the denominator (one extra column, dropped after the softmax)."""
    if sinks_GR is None:
        return torch.softmax(scores, dim=-1)
    shape = (1, *sinks_GR.shape, *([1] * (scores.dim() - 3)))
    sink = sinks_GR.float().view(shape).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]


def paged_attention_decode_torch(q, k_cache, v_cache, block_tables, context_lens, scale: float,
                                 window: Optional[int] = None, sinks_H: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Reference decode: gather each sequence's blocks, mask past `context_lens` (and before the
    window), softmax in fp32 (with the sinks)."""
    check_attention(q, k_cache, v_cache, block_tables, context_lens, "paged_attention_decode")
    S, H, d = q.shape
    G = k_cache.shape[2]
    k = gather_cache(k_cache, block_tables).float()  # [S, L, G, d]
    v = gather_cache(v_cache, block_tables).float()
    scores = torch.einsum("sgrd,slgd->sgrl", q.reshape(S, G, H // G, d).float(), k) * scale
    k_pos = torch.arange(k.shape[1], device=q.device)[None, :]
    valid = k_pos < context_lens[:, None]  # [S, L]
    if window is not None:  # the query is the last token, at position context_len - 1
        valid = valid & (k_pos > context_lens[:, None] - 1 - window)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    sinks_GR = None if sinks_H is None else sinks_H.view(G, H // G)
    out = torch.einsum("sgrl,slgd->sgrd", softmax_with_sinks(scores, sinks_GR), v)
    return out.reshape(S, H, d).to(q.dtype)


def paged_attention_prefill_torch(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale: float,
                                  max_seqlen_q: Optional[int] = None, window: Optional[int] = None,
                                  sinks_H: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Reference varlen prefill: pad the queries to [S, max_q_len], gather the caches, apply the
    causal mask aligned to the end of each context (and the window), softmax in fp32 (with the
    sinks), drop the padding rows."""
    check_attention(q, k_cache, v_cache, block_tables, context_lens, "paged_attention_prefill")
    check_cu_seqlens(q, cu_seqlens_q, context_lens)
    N, H, d = q.shape
    S, G = context_lens.shape[0], k_cache.shape[2]
    if N == 0 or S == 0:
        return q.new_empty(N, H, d)
    cu = cu_seqlens_q.long()
    q_lens = cu[1:] - cu[:-1]
    Mq = int(max_seqlen_q) if max_seqlen_q is not None else int(q_lens.max())
    j = torch.arange(Mq, device=q.device)
    valid_q = j[None, :] < q_lens[:, None]  # [S, Mq]
    rows = torch.where(valid_q, cu[:-1, None] + j[None, :], torch.zeros_like(valid_q, dtype=torch.long))
    qp = q[rows].reshape(S, Mq, G, H // G, d).float()
    k = gather_cache(k_cache, block_tables).float()
    v = gather_cache(v_cache, block_tables).float()
    scores = torch.einsum("smgrd,slgd->sgrml", qp, k) * scale
    q_pos = (context_lens.long() - q_lens)[:, None] + j[None, :]  # absolute position of each query
    k_pos = torch.arange(k.shape[1], device=q.device)
    mask = (k_pos[None, None, :] <= q_pos[:, :, None]) & (k_pos[None, :] < context_lens[:, None])[:, None, :]
    if window is not None:
        mask = mask & (k_pos[None, None, :] > q_pos[:, :, None] - window)
    scores = scores.masked_fill(~mask[:, None, None], float("-inf"))
    sinks_GR = None if sinks_H is None else sinks_H.view(G, H // G)
    out = torch.einsum("sgrml,slgd->smgrd", softmax_with_sinks(scores, sinks_GR), v).reshape(S, Mq, H, d)
    return out[valid_q].to(q.dtype)
