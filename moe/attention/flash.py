"""flash-attn backends: `flash` for training (`flash_attn_func`) and `flash` for the engine's
paged cache (`flash_attn_with_kvcache` / `flash_attn_varlen_func` with a block table).

Both need the `gpu` extra (`pip install -e ".[gpu]"`) and a CUDA device; `flash_unavailable_reason`
is the one check of that, shared by both. flash-attn is imported lazily, on first use: it is a
heavy optional dependency that initialises CUDA, so merely importing the model must not need it.
"""

from __future__ import annotations

import importlib.util
import inspect
from typing import Optional

import torch

from moe.attention.base import ATTENTION_BACKENDS, PAGED_BACKENDS, AttentionBackend, PagedAttentionBackend
from moe.errors import ConfigError
from kernels.paged_attention import reshape_and_cache

INSTALL_HINT = "flash-attn is not installed: pip install -e '.[gpu]' (the `gpu` extra, flash-attn>=2.6)"


def flash_unavailable_reason(what: str = "attention.name='flash'") -> Optional[str]:
    """Why flash-attn cannot run here (not installed, no CUDA), or None."""
    if importlib.util.find_spec("flash_attn") is None:
        return f"{what} needs flash-attn, which is not installed: pip install -e '.[gpu]' (flash-attn>=2.6)"
    if not torch.cuda.is_available():
        return f"{what} needs a CUDA GPU (flash-attn has no CPU kernels); use the sdpa/torch backend on CPU"
    return None


def _input_error(q_BHTd, k_BGTd, v_BGTd) -> Optional[str]:
    if q_BHTd.device.type != "cuda":
        return (f"attention.name='flash' runs on CUDA tensors; got q on {q_BHTd.device} "
                "(use attention.name=sdpa on CPU)")
    if q_BHTd.dtype not in (torch.float16, torch.bfloat16) or k_BGTd.dtype != q_BHTd.dtype \
            or v_BGTd.dtype != q_BHTd.dtype:
        return (f"attention.name='flash' needs fp16/bf16 q, k, v (got {q_BHTd.dtype}, {k_BGTd.dtype}, "
                f"{v_BGTd.dtype}); train with train.dtype=bf16 or use attention.name=sdpa")
    d = q_BHTd.shape[-1]
    if d > 256 or d % 8:
        return f"attention.name='flash' supports head_dim <= 256 and a multiple of 8; got {d}"
    return None


@ATTENTION_BACKENDS.register("flash")
class FlashAttention(AttentionBackend):
    """flash-attn's `flash_attn_func`; GQA natively (k/v keep their G heads), causal mask aligned
    to the bottom-right when T != S (as `eager`). Layout: ours `[B, H, T, d]` <-> flash `[B, T, H, d]`."""

    name = "flash"
    unavailable_reason = staticmethod(flash_unavailable_reason)
    supports_sinks = False  # flash-attn 2 has no sink logit in its softmax

    def __init__(self):
        from flash_attn import flash_attn_func  # lazy: heavy optional CUDA dependency (module docstring)
        self._fn = flash_attn_func

    def __call__(self, q_BHTd, k_BGTd, v_BGTd, causal: bool = True, window=None, sinks_H=None, attn_mask=None):
        if attn_mask is not None:  # flash_attn_func takes no mask; varlen packing is not wired up here
            raise ConfigError("attention.name='flash' cannot apply a packed row's document mask (data.packing=true): "
                              "use attention.name=sdpa, or data.packing=false")
        self.check_layer_options(window, sinks_H is not None)
        err = _input_error(q_BHTd, k_BGTd, v_BGTd)
        if err is not None:
            raise RuntimeError(err)
        o_BTHd = self._fn(q_BHTd.transpose(1, 2), k_BGTd.transpose(1, 2), v_BGTd.transpose(1, 2), causal=causal,
                          **flash_window(window))
        return o_BTHd.transpose(1, 2)


def flash_window(window) -> dict:
    """flash-attn's `window_size=(left, right)` (a query sees `left` keys before itself) for a
    sliding window; nothing for full attention, so flash-attn's own default applies."""
    return {} if window is None else {"window_size": (window - 1, 0)}


def _paged_unavailable_reason() -> Optional[str]:
    reason = flash_unavailable_reason("attention_backend='flash'")
    if reason is not None:
        return reason
    from flash_attn import flash_attn_varlen_func  # lazy: see the module docstring
    if "block_table" not in inspect.signature(flash_attn_varlen_func).parameters:
        return ("attention_backend='flash' needs flash-attn >= 2.6 (flash_attn_varlen_func with a block_table): "
                "pip install -U 'flash-attn>=2.6'")
    return None


@PAGED_BACKENDS.register("flash")
class FlashPagedAttention(PagedAttentionBackend):
    """flash-attn 2 with a block table: `flash_attn_with_kvcache` for decode and
    `flash_attn_varlen_func(..., block_table=...)` for prefill; cache writes use the Triton kernel."""

    name = "flash"
    unavailable_reason = staticmethod(_paged_unavailable_reason)
    supports_sinks = False  # flash-attn 2 has no sink logit in its softmax

    def __init__(self):
        from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache  # lazy: module docstring
        self._with_kvcache, self._varlen = flash_attn_with_kvcache, flash_attn_varlen_func

    def check_config(self, block_size, head_dim, dtype, device):
        if device.type != "cuda":
            raise ConfigError(f"attention_backend='flash' needs a CUDA device; got device={device}")
        if dtype not in (torch.float16, torch.bfloat16):
            raise ConfigError(f"attention_backend='flash' needs an fp16/bf16 model and cache; got dtype={dtype}")
        if block_size % 256 != 0:
            raise ConfigError(f"attention_backend='flash' needs block_size to be a multiple of 256 (flash-attn's "
                              f"paged KV limit); got block_size={block_size}. Use block_size=256 or "
                              "attention_backend='triton'")

    def write(self, k, v, k_cache, v_cache, slot_mapping, plan=None):  # (no plan_write: never given one)
        reshape_and_cache(k, v, k_cache, v_cache, slot_mapping)

    def decode(self, q, k_cache, v_cache, block_tables, context_lens, scale, window=None, sinks_H=None, plan=None):
        self.check_layer_options(window, sinks_H is not None)
        out = self._with_kvcache(q.unsqueeze(1), k_cache, v_cache, cache_seqlens=context_lens,
                                 block_table=block_tables, softmax_scale=scale, causal=True,
                                 **flash_window(window))
        return out.squeeze(1)

    def prefill(self, q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, max_seqlen_q,
                window=None, sinks_H=None):
        self.check_layer_options(window, sinks_H is not None)
        cu_k = torch.nn.functional.pad(torch.cumsum(context_lens, 0, dtype=torch.int32), (1, 0))
        max_k = block_tables.shape[1] * k_cache.shape[1]
        return self._varlen(q, k_cache, v_cache, cu_seqlens_q, cu_k, max_seqlen_q, max_k, softmax_scale=scale,
                            causal=True, block_table=block_tables, **flash_window(window))
