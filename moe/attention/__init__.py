"""Attention backends, registered by name: training (`ATTENTION_BACKENDS`, `attention.name`) and
the engine's paged cache (`PAGED_BACKENDS`, `attention_backend`), one module each; both
registries import every module of this package when first asked. See `base.py`. Two modules are
not backends but the model's: `mla` (DeepSeek's Multi-head Latent Attention) and `mla_paged` (its
latent KV cache: the absorbed attention over any paged backend, and the expanded reference)."""

from moe.attention.base import (ATTENTION_BACKENDS, PAGED_BACKENDS, AttentionBackend, PagedAttentionBackend,
                                repeat_kv)
from moe.attention.eager import eager_attention
from moe.attention.mla import MultiHeadLatentAttention
from moe.errors import ConfigError

__all__ = ["ATTENTION_BACKENDS", "PAGED_BACKENDS", "AttentionBackend", "MultiHeadLatentAttention",
           "PagedAttentionBackend", "eager_attention", "paged_backend", "repeat_kv"]


def paged_backend(name: str, device, model_cfg=None) -> PagedAttentionBackend:
    """The engine's paged backend `name` ("auto": triton on CUDA when it can run and honours the
    layers of `model_cfg` (sliding windows, sinks), torch elsewhere)."""
    if name == "auto":
        cuda = getattr(device, "type", str(device).split(":")[0]) == "cuda"
        name = "triton" if cuda and PAGED_BACKENDS.unavailable_reason("triton") is None \
            and _honours(PAGED_BACKENDS.lookup("triton"), model_cfg) else "torch"
    return PAGED_BACKENDS.get(name)()


def _honours(backend: type[PagedAttentionBackend], model_cfg) -> bool:
    if model_cfg is None:
        return True
    try:
        backend.check_model(model_cfg)
    except ConfigError:
        return False
    return True
