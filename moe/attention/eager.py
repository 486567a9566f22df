"""`eager`: the plain reference attention (explicit scores, fp32 softmax) every other backend
is tested against; it honours sliding windows and attention sinks."""

from __future__ import annotations

import math
from typing import Optional

import torch

from moe.attention.base import ATTENTION_BACKENDS, AttentionBackend, allowed_mask, repeat_kv


def eager_attention(q_BHTd, k_BGTd, v_BGTd, causal: bool = True, window: Optional[int] = None,
                    sinks_H: Optional[torch.Tensor] = None, attn_mask=None) -> torch.Tensor:
    """Causal attention with the mask aligned bottom-right when T != S (queries are the last T
    of S positions), limited to the last `window` positions when set; `sinks_H` (one logit per
    query head) joins each row's softmax as an extra column whose probability is dropped.
    `attn_mask` (bool [B, 1, T, S], True = attend; a packed row's document mask,
    `moe/attention/document_mask.py`) replaces the causal mask; the window applies inside it."""
    n_rep = q_BHTd.shape[1] // k_BGTd.shape[1]
    k, v = repeat_kv(k_BGTd, n_rep), repeat_kv(v_BGTd, n_rep)
    scores_BHTS = (q_BHTd @ k.transpose(-2, -1)).float() / math.sqrt(q_BHTd.shape[-1])
    T, S = scores_BHTS.shape[-2:]
    if attn_mask is not None or causal or window is not None:
        if not causal:
            raise ValueError("a sliding window or a document mask is a causal mask; got causal=False")
        allowed = allowed_mask(T, S, window, q_BHTd.device)
        if attn_mask is not None:
            allowed = attn_mask & allowed
        scores_BHTS = scores_BHTS.masked_fill(~allowed, float("-inf"))
    if sinks_H is None:
        probs = torch.softmax(scores_BHTS, dim=-1)
    else:
        B, H = scores_BHTS.shape[:2]
        sink_BHT1 = sinks_H.float().view(1, H, 1, 1).expand(B, H, T, 1)
        probs = torch.softmax(torch.cat([scores_BHTS, sink_BHT1], dim=-1), dim=-1)[..., :S]
    return probs.to(v.dtype) @ v


@ATTENTION_BACKENDS.register("eager")
class EagerAttention(AttentionBackend):
    name = "eager"

    def __call__(self, q_BHTd, k_BGTd, v_BGTd, causal: bool = True, window=None, sinks_H=None, attn_mask=None):
        return eager_attention(q_BHTd, k_BGTd, v_BGTd, causal, window, sinks_H, attn_mask)
