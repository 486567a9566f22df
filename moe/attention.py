"""Attention backends for full (training / no-cache) causal attention.

Each backend maps `(q_BHTd, k_BGTd, v_BGTd)` with H query heads and G <= H key/value heads
(grouped-query attention, H % G == 0) to `o_BHTd`, causal. `eager` is the plain reference,
`sdpa` uses PyTorch's fused scaled_dot_product_attention (flash / memory-efficient kernels),
`flash` calls flash-attn's `flash_attn_func` (CUDA, fp16/bf16; needs the `gpu` extra).

A backend may carry `check_available()` / `unavailable_reason()` (see `moe/registry.py`): the
model fetches its backend with `ATTENTION_BACKENDS.get(name)` when it is built, so one that
cannot run here fails at start-up with a ConfigError, not at the first forward pass.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Optional

import torch
import torch.nn.functional as F

from moe.registry import Registry


ATTENTION_BACKENDS: Registry = Registry("attention.name")


def backend_unavailable_reason(name: str) -> Optional[str]:
    """Why backend `name` cannot run on this machine, or None when it can (unknown names raise)."""
    return ATTENTION_BACKENDS.unavailable_reason(name)


def repeat_kv(k_BGTd: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Expand G kv heads to G * n_rep heads (each kv head serves n_rep query heads)."""
    if n_rep == 1:
        return k_BGTd
    return k_BGTd.repeat_interleave(n_rep, dim=1)


@ATTENTION_BACKENDS.register("eager")
def eager_attention(q_BHTd, k_BGTd, v_BGTd, causal: bool = True):
    n_rep = q_BHTd.shape[1] // k_BGTd.shape[1]
    k, v = repeat_kv(k_BGTd, n_rep), repeat_kv(v_BGTd, n_rep)
    scores_BHTS = (q_BHTd @ k.transpose(-2, -1)).float() / math.sqrt(q_BHTd.shape[-1])
    if causal:
        T, S = scores_BHTS.shape[-2:]
        mask = torch.ones(T, S, dtype=torch.bool, device=q_BHTd.device).tril(S - T)
        scores_BHTS = scores_BHTS.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores_BHTS, dim=-1).to(v.dtype)
    return probs @ v


@ATTENTION_BACKENDS.register("sdpa")
def sdpa_attention(q_BHTd, k_BGTd, v_BGTd, causal: bool = True):
    n_rep = q_BHTd.shape[1] // k_BGTd.shape[1]
    return F.scaled_dot_product_attention(q_BHTd, k_BGTd, v_BGTd, is_causal=causal, enable_gqa=n_rep > 1)


# ---------------------------------------------------------------------------------------- flash

FLASH_INSTALL_HINT = "attention.name='flash' needs the flash-attn package: pip install -e '.[gpu]'"
_flash_fn = None


def _flash_unavailable_reason() -> Optional[str]:
    if importlib.util.find_spec("flash_attn") is None:
        return FLASH_INSTALL_HINT
    if not torch.cuda.is_available():
        return ("attention.name='flash' needs a CUDA GPU (flash-attn has no CPU kernels); "
                "use attention.name=sdpa on CPU")
    return None


def _check_flash_available() -> None:
    from moe.config import ConfigError  # local: moe.config imports this module
    reason = _flash_unavailable_reason()
    if reason is not None:
        raise ConfigError(reason)


def _flash_input_error(q_BHTd, k_BGTd, v_BGTd) -> Optional[str]:
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
def flash_attention(q_BHTd, k_BGTd, v_BGTd, causal: bool = True):
    """flash-attn's `flash_attn_func`; GQA natively (k/v keep their G heads), causal mask aligned to
    the bottom-right when T != S (as `eager`). Layout: ours `[B, H, T, d]` <-> flash `[B, T, H, d]`."""
    global _flash_fn
    if _flash_fn is None:
        _check_flash_available()
        from flash_attn import flash_attn_func
        _flash_fn = flash_attn_func
    err = _flash_input_error(q_BHTd, k_BGTd, v_BGTd)
    if err is not None:
        raise RuntimeError(err)
    o_BTHd = _flash_fn(q_BHTd.transpose(1, 2), k_BGTd.transpose(1, 2), v_BGTd.transpose(1, 2), causal=causal)
    return o_BTHd.transpose(1, 2)


flash_attention.check_available = _check_flash_available
flash_attention.unavailable_reason = _flash_unavailable_reason
