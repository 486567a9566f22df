"""The two attention interfaces and their registries.

* `AttentionBackend` (`ATTENTION_BACKENDS`, config field `attention.name`): full causal attention
  over a batch, for training and plain forwards. `backend(q_BHTd, k_BGTd, v_BGTd, causal)` with
  H query heads and G <= H key/value heads (grouped-query attention, H % G == 0) -> `o_BHTd`.
* `PagedAttentionBackend` (`PAGED_BACKENDS`, engine option `attention_backend`): attention
  against the engine's paged KV cache: `write` new K/V into their slots, `decode` one query per
  sequence, `prefill` varlen chunks (semantics: the references in `kernels/paged_attention`).

Each backend is a class registered by name; `unavailable_reason()` (a staticmethod, None when
it can run) is its one availability check, asked by `Registry.get`, so a backend that cannot run
here fails when the model or engine is built with an `UnavailableError` saying why.
"""

from __future__ import annotations

from typing import Optional

import torch

from moe.registry import Registry


class AttentionBackend:
    name = "base"

    @staticmethod
    def unavailable_reason() -> Optional[str]:
        return None

    def __call__(self, q_BHTd: torch.Tensor, k_BGTd: torch.Tensor, v_BGTd: torch.Tensor,
                 causal: bool = True, attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """`attn_mask`: None, or a packed row's boolean document mask [B, 1, T, S] (True = attend,
        causal already; `document_mask.py`) that replaces the causal mask."""
        raise NotImplementedError


class PagedAttentionBackend:
    """What the engine's kv context calls: `write`, `decode`, `prefill` (`max_seqlen_q` is a host
    int the engine already knows). `check_config` raises a ConfigError naming the engine option
    that this backend cannot serve (block size, dtype, device)."""

    name = "base"

    @staticmethod
    def unavailable_reason() -> Optional[str]:
        return None

    def check_config(self, block_size: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        pass

    def write(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        raise NotImplementedError

    def decode(self, q, k_cache, v_cache, block_tables, context_lens, scale):
        raise NotImplementedError

    def prefill(self, q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, max_seqlen_q):
        raise NotImplementedError


ATTENTION_BACKENDS: Registry[type[AttentionBackend]] = Registry("attention.name")
PAGED_BACKENDS: Registry[type[PagedAttentionBackend]] = Registry("attention_backend")


def repeat_kv(k_BGTd: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Expand G kv heads to G * n_rep heads (each kv head serves n_rep query heads)."""
    if n_rep == 1:
        return k_BGTd
    return k_BGTd.repeat_interleave(n_rep, dim=1)
