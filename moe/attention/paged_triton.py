"""`triton` paged backend: the Triton kernels of `kernels/paged_attention` (CUDA; on CPU only
under `TRITON_INTERPRET=1`, for tests); the engine's default on CUDA."""

from __future__ import annotations

from typing import Optional

from kernels.paged_attention import (paged_attention_decode, paged_attention_prefill, reshape_and_cache,
                                     runnable_reason)
from moe.attention.base import PAGED_BACKENDS, PagedAttentionBackend
from moe.errors import ConfigError


def _unavailable_reason() -> Optional[str]:
    reason = runnable_reason()
    return None if reason is None else f"attention_backend='triton': {reason}; or use attention_backend='torch'"


@PAGED_BACKENDS.register("triton")
class TritonPagedAttention(PagedAttentionBackend):
    name = "triton"
    unavailable_reason = staticmethod(_unavailable_reason)
    # Both kernels take a layer's window (each tile starts at the window: released blocks are never
    # read) and its sinks (one more denominator term; after the split-KV merge in decode).
    supports_window = True
    supports_sinks = True

    def __init__(self, num_splits: Optional[int] = None):
        self.num_splits = num_splits

    def check_config(self, block_size, head_dim, dtype, device):
        reason = runnable_reason(device)
        if reason is not None:
            raise ConfigError(f"attention_backend='triton' with device={device}: {reason}; "
                              "or use attention_backend='torch'")

    def write(self, k, v, k_cache, v_cache, slot_mapping, plan=None):  # (no plan_write: never given one)
        reshape_and_cache(k, v, k_cache, v_cache, slot_mapping)

    def decode(self, q, k_cache, v_cache, block_tables, context_lens, scale, window=None, sinks_H=None, plan=None):
        return paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale, self.num_splits,
                                      window=window, sinks_H=sinks_H)

    def prefill(self, q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, max_seqlen_q,
                window=None, sinks_H=None):
        return paged_attention_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale,
                                       max_seqlen_q, window=window, sinks_H=sinks_H)
