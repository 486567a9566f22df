"""Input checks of the paged-attention operations (shared by the Triton launchers and the
PyTorch references): shapes, dtypes and devices, each failing with a ValueError naming the
operation and the argument."""

from __future__ import annotations

import torch

from kernels.runtime import FLOAT_DTYPES


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """One layer's cache: two `[num_blocks, block_size, n_kv_heads, head_dim]` tensors, one dtype and device."""
    if k_cache.dim() != 4:
        raise ValueError(f"k_cache must be [num_blocks, block_size, n_kv_heads, head_dim]; "
                         f"got shape {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} != k_cache shape {tuple(k_cache.shape)}")
    if k_cache.dtype not in FLOAT_DTYPES or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"caches must share one dtype of {FLOAT_DTYPES}; got k {k_cache.dtype}, v {v_cache.dtype}")
    if k_cache.device != v_cache.device:
        raise ValueError(f"k_cache is on {k_cache.device} but v_cache on {v_cache.device}")


def check_attention(q, k_cache, v_cache, block_tables, context_lens, what: str) -> None:
    """The arguments of decode / prefill (`what`): q `[tokens, H, d]` against the cache, int32 tables and lengths."""
    check_cache(k_cache, v_cache)
    if q.dim() != 3:
        raise ValueError(f"{what}: q must be [tokens, n_heads, head_dim]; got shape {tuple(q.shape)}")
    if q.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{what}: q dtype {q.dtype} is not one of {FLOAT_DTYPES}")
    H, d = q.shape[1], q.shape[2]
    G, dc = k_cache.shape[2], k_cache.shape[3]
    if d != dc:
        raise ValueError(f"{what}: q head_dim {d} != cache head_dim {dc}")
    if H % G != 0:
        raise ValueError(f"{what}: n_heads {H} must be a multiple of the cache's n_kv_heads {G}")
    if block_tables.dim() != 2 or block_tables.dtype != torch.int32:
        raise ValueError(f"{what}: block_tables must be a 2-D int32 tensor [num_seqs, max_blocks]; "
                         f"got {block_tables.dtype} of shape {tuple(block_tables.shape)}")
    if context_lens.dim() != 1 or context_lens.dtype != torch.int32:
        raise ValueError(f"{what}: context_lens must be a 1-D int32 tensor [num_seqs]; "
                         f"got {context_lens.dtype} of shape {tuple(context_lens.shape)}")
    if context_lens.shape[0] != block_tables.shape[0]:
        raise ValueError(f"{what}: context_lens has {context_lens.shape[0]} sequences but block_tables "
                         f"{block_tables.shape[0]}")
    for name, t in (("k_cache", k_cache), ("block_tables", block_tables), ("context_lens", context_lens)):
        if t.device != q.device:
            raise ValueError(f"{what}: q is on {q.device} but {name} on {t.device}")


def check_write(k, v, k_cache, v_cache, slot_mapping) -> None:
    """The arguments of reshape_and_cache: `k, v [N, G, d]` that fit the cache, one slot per token."""
    check_cache(k_cache, v_cache)
    G, d = k_cache.shape[2], k_cache.shape[3]
    if k.dim() != 3 or k.shape[1:] != (G, d) or v.shape != k.shape:
        raise ValueError(f"reshape_and_cache: k and v must be [N, {G}, {d}] to fit the cache; "
                         f"got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != k.shape[0]:
        raise ValueError(f"reshape_and_cache: slot_mapping must be [N={k.shape[0]}]; "
                         f"got {tuple(slot_mapping.shape)}")
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"reshape_and_cache: slot_mapping must be int32 or int64; got {slot_mapping.dtype}")
    for name, t in (("v", v), ("k_cache", k_cache), ("slot_mapping", slot_mapping)):
        if t.device != k.device:
            raise ValueError(f"reshape_and_cache: k is on {k.device} but {name} on {t.device}")


def check_cu_seqlens(q, cu_seqlens_q, context_lens) -> None:
    """The prefill's query offsets: int32 `[num_seqs + 1]` on q's device."""
    S = context_lens.shape[0]
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] != S + 1 or cu_seqlens_q.dtype != torch.int32:
        raise ValueError(f"paged_attention_prefill: cu_seqlens_q must be a 1-D int32 tensor of num_seqs + 1 = "
                         f"{S + 1} entries; got {cu_seqlens_q.dtype} of shape {tuple(cu_seqlens_q.shape)}")
    if cu_seqlens_q.device != q.device:
        raise ValueError(f"paged_attention_prefill: q is on {q.device} but cu_seqlens_q on "
                         f"{cu_seqlens_q.device}")



def check_window_sinks(q, window, sinks_H, what: str) -> None:
    """A layer's options: `window` None or an int >= 1; `sinks_H` None or a float `[n_heads]` on q's device."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"{what}: window must be None or an int >= 1; got {window!r}")
    if sinks_H is not None:
        if sinks_H.shape != (q.shape[1],) or sinks_H.dtype not in FLOAT_DTYPES or sinks_H.device != q.device:
            raise ValueError(f"{what}: sinks_H must be a float [n_heads={q.shape[1]}] tensor on {q.device}; "
                             f"got {sinks_H.dtype} of shape {tuple(sinks_H.shape)} on {sinks_H.device}")
