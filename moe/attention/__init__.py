"""Attention backends, registered by name: training (`ATTENTION_BACKENDS`, `attention.name`) and
the engine's paged cache (`PAGED_BACKENDS`, `attention_backend`), one module each; both
registries import every module of this package when first asked. See `base.py`."""

from moe.attention.base import (ATTENTION_BACKENDS, PAGED_BACKENDS, AttentionBackend, PagedAttentionBackend,
                                repeat_kv)
from moe.attention.eager import eager_attention

__all__ = ["ATTENTION_BACKENDS", "PAGED_BACKENDS", "AttentionBackend", "PagedAttentionBackend", "eager_attention",
           "paged_backend", "repeat_kv"]


def paged_backend(name: str, device) -> PagedAttentionBackend:
    """The engine's paged backend `name` ("auto": triton on CUDA when it can run, torch elsewhere)."""
    if name == "auto":
        cuda = getattr(device, "type", str(device).split(":")[0]) == "cuda"
        name = "triton" if cuda and PAGED_BACKENDS.unavailable_reason("triton") is None else "torch"
    return PAGED_BACKENDS.get(name)()
