"""`sdpa`: PyTorch's fused `scaled_dot_product_attention` (flash / memory-efficient kernels).

A sliding window is an explicit boolean mask. Attention sinks have no argument in
`scaled_dot_product_attention` (its softmax runs over the keys only), so they take an explicit
path: one extra key and value of zeros is appended to every kv head, and an additive float mask
gives that column the head's sink logit (q . 0 + sink = sink) and -inf where the causal / window
mask forbids. The softmax then has the sink in its denominator and the zero value adds nothing
to the output: exactly GPT-OSS's sinks, still through the fused kernel (with a [H, T, S + 1]
mask, so memory O(T x S) as the eager path)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moe.attention.base import ATTENTION_BACKENDS, AttentionBackend, allowed_mask, with_sink_column
from moe.attention.eager import eager_attention


@ATTENTION_BACKENDS.register("sdpa")
class SDPAAttention(AttentionBackend):
    name = "sdpa"

    def __call__(self, q_BHTd, k_BGTd, v_BGTd, causal: bool = True, window=None, sinks_H=None, attn_mask=None):
        gqa = q_BHTd.shape[1] != k_BGTd.shape[1]
        if window is None and sinks_H is None and attn_mask is None:
            return F.scaled_dot_product_attention(q_BHTd, k_BGTd, v_BGTd, is_causal=causal, enable_gqa=gqa)
        if not causal:
            raise ValueError("sliding windows, sinks and document masks are options of causal attention; "
                             "got causal=False")
        allowed = allowed_mask(q_BHTd.shape[2], k_BGTd.shape[2], window, q_BHTd.device)
        if attn_mask is not None:  # a packed row's document mask [B, 1, T, S] (already causal)
            if sinks_H is not None:  # the sink column's bias is built over one [T, S] mask: the reference path
                return eager_attention(q_BHTd, k_BGTd, v_BGTd, causal, window, sinks_H, attn_mask)
            allowed = attn_mask & allowed
        if sinks_H is None:
            return F.scaled_dot_product_attention(q_BHTd, k_BGTd, v_BGTd, attn_mask=allowed, enable_gqa=gqa)
        k_BGSd, v_BGSd, bias_HTS = with_sink_column(q_BHTd, k_BGTd, v_BGTd, allowed, sinks_H)
        return F.scaled_dot_product_attention(q_BHTd, k_BGSd, v_BGSd, attn_mask=bias_HTS, enable_gqa=gqa)
