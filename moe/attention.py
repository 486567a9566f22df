"""Attention backends for full (training / no-cache) causal attention.

Each backend maps `(q_BHTd, k_BGTd, v_BGTd)` with H query heads and G <= H key/value heads
(grouped-query attention, H % G == 0) to `o_BHTd`, causal. `eager` is the plain reference,
`sdpa` uses PyTorch's fused scaled_dot_product_attention (flash / memory-efficient kernels).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from moe.registry import Registry

ATTENTION_BACKENDS: Registry = Registry("attention.name")


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
