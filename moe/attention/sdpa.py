"""`sdpa`: PyTorch's fused `scaled_dot_product_attention` (flash / memory-efficient kernels)."""

from __future__ import annotations

import torch.nn.functional as F

from moe.attention.base import ATTENTION_BACKENDS, AttentionBackend


@ATTENTION_BACKENDS.register("sdpa")
class SDPAAttention(AttentionBackend):
    name = "sdpa"

    def __call__(self, q_BHTd, k_BGTd, v_BGTd, causal: bool = True, attn_mask=None):
        n_rep = q_BHTd.shape[1] // k_BGTd.shape[1]
        if attn_mask is not None:  # a packed row's document mask (already causal)
            return F.scaled_dot_product_attention(q_BHTd, k_BGTd, v_BGTd, attn_mask=attn_mask, enable_gqa=n_rep > 1)
        return F.scaled_dot_product_attention(q_BHTd, k_BGTd, v_BGTd, is_causal=causal, enable_gqa=n_rep > 1)
