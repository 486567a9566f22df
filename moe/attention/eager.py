"""`eager`: the plain reference attention (explicit scores, fp32 softmax) every other backend
is tested against."""

from __future__ import annotations

import math

import torch

from moe.attention.base import ATTENTION_BACKENDS, AttentionBackend, repeat_kv


def eager_attention(q_BHTd, k_BGTd, v_BGTd, causal: bool = True, attn_mask=None) -> torch.Tensor:
    """Causal attention with the mask aligned bottom-right when T != S (queries are the last T
    of S positions). `attn_mask` (bool, True = attend; a packed row's document mask,
    `moe/attention/document_mask.py`) replaces the causal mask."""
    n_rep = q_BHTd.shape[1] // k_BGTd.shape[1]
    k, v = repeat_kv(k_BGTd, n_rep), repeat_kv(v_BGTd, n_rep)
    scores_BHTS = (q_BHTd @ k.transpose(-2, -1)).float() / math.sqrt(q_BHTd.shape[-1])
    if attn_mask is not None:
        scores_BHTS = scores_BHTS.masked_fill(~attn_mask, float("-inf"))
    elif causal:
        T, S = scores_BHTS.shape[-2:]
        mask = torch.ones(T, S, dtype=torch.bool, device=q_BHTd.device).tril(S - T)
        scores_BHTS = scores_BHTS.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores_BHTS, dim=-1).to(v.dtype)
    return probs @ v


@ATTENTION_BACKENDS.register("eager")
class EagerAttention(AttentionBackend):
    name = "eager"

    def __call__(self, q_BHTd, k_BGTd, v_BGTd, causal: bool = True, attn_mask=None):
        return eager_attention(q_BHTd, k_BGTd, v_BGTd, causal, attn_mask)
