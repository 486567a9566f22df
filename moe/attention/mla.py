"""Multi-head Latent Attention (MLA, DeepSeek-V2 arXiv:2405.04434 section 2.1; DeepSeek-V3), as
transformers' `DeepseekV2Attention` / `DeepseekV3Attention` compute it (`model.attention_kind=mla`).

Stages: queries from the hidden state (one projection, or `q_lora_rank`: down-projection ->
RMSNorm -> up-projection) -> each head's query split into `qk_nope_head_dim` dims without
position and `qk_rope_head_dim` rotary dims -> keys and values from a `kv_lora_rank` latent
(`kv_a_proj` also gives one rotary key per token, shared by all heads; the latent is normalised
and up-projected by `kv_b_proj` into each head's nope key and value) -> rotary on the rope parts
(`rope_interleave`: DeepSeek's (even, odd) pairs, else "rotate half") -> softmax(q k^T * scale) v
with q/k heads of nope + rope dims and value heads of `v_head_dim` -> output projection.

The softmax scale is (nope + rope)^-0.5, times YaRN's mscale(factor, mscale_all_dim)^2 when the
rotary is scaled (DeepSeek's `yarn_apply_mscale`); the backends divide by sqrt(q's width), so q
is multiplied by the ratio. Training runs the configured backend (sdpa / eager: their q/k and v
widths may differ).

Under the engine the cache is latent (the kv context's `latent` layout): per token one row, the
normalised `kv_lora_rank` latent c and the rotated rope key, and attention is the absorbed form
(DeepSeek-V2 appendix B; vLLM's MLA backend): with kv_b_proj = [W_UK; W_UV] per head, the score
q_nope . (W_UK c) = (W_UK^T q_nope) . c, so each head's query becomes [W_UK^T q_nope, q_rope]
and attends to the rows [c, k_rope] as multi-query attention with one kv head; the output is a
latent mix sum_j p_j c_j, and W_UV (then o_proj) turns it into each head's value mix. Decode
runs this way (on CUDA with the `triton` backend through kernels/mla_decode's Triton kernel).
Prefill and chunked extends (with a cached prefix or not) expand the sequence's cached latents
into per-head keys and values once per step and attend at width nope + rope (vLLM's MLA prefill),
unless the query runs are short enough that the absorbed form is cheaper (speculative
verification): moe/attention/mla_paged.py's `LatentAttention` and `prefill_form`. The expanded
form with a per-head cache (`attend_expanded`) is kept (a kv context without the latent layout).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from moe.attention.base import ATTENTION_BACKENDS
from moe.attention.mla_paged import LatentAttention, mla_softmax_scale, per_token_fp8_qdq

# HF's DeepSeek builds q_a_layernorm / kv_a_layernorm with RMSNorm's default eps, not rms_norm_eps.
LATENT_NORM_EPS = 1e-6


def yarn_softmax_mscale(rope_scaling) -> float:
    """DeepSeek's factor on the softmax scale: mscale(factor, mscale_all_dim)^2 with a scaled rotary
    that states `mscale_all_dim`, else 1 (transformers' `yarn_apply_mscale`)."""
    s = rope_scaling or {}
    all_dim, factor = s.get("mscale_all_dim"), float(s.get("factor") or 1.0)
    if not all_dim or factor <= 1:
        return 1.0
    m = 0.1 * all_dim * math.log(factor) + 1.0
    return m * m


def rotate(x_BHTr: torch.Tensor, cos_BTr: torch.Tensor, sin_BTr: torch.Tensor, interleave: bool) -> torch.Tensor:
    """Rotary on the last dim. `interleave`: pairs (x0, x1), (x2, x3), ... turn together, and the
    result comes out de-interleaved (evens' rotation, then odds'), exactly as HF's
    `apply_rotary_pos_emb_interleave` returns it; else "rotate half" (the model's rotary)."""
    if interleave:
        x_BHTr = torch.cat([x_BHTr[..., 0::2], x_BHTr[..., 1::2]], dim=-1)
    cos, sin = cos_BTr.unsqueeze(1), sin_BTr.unsqueeze(1)
    x1, x2 = x_BHTr.chunk(2, dim=-1)
    wide = torch.promote_types(x_BHTr.dtype, torch.float32)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x_BHTr.to(wide) * cos + rotated.to(wide) * sin).to(x_BHTr.dtype)


class MultiHeadLatentAttention(nn.Module):
    """MLA for one layer (module docstring). `norm` builds the model's RMSNorm (`norm(dim, eps)`),
    so the latents are normalised exactly as the rest of the model is."""

    def __init__(self, cfg: Any, layer_idx: int, norm: Callable[[int, float], nn.Module]):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.kv_lora_rank = cfg.n_heads, cfg.kv_lora_rank
        self.nope, self.rope, self.v_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.cache_dim, self.interleave = cfg.resolved_head_dim, cfg.rope_interleave
        H, qk = self.n_heads, self.nope + self.rope
        if cfg.q_lora_rank is None:
            self.q_proj = nn.Linear(cfg.d_model, H * qk, bias=False)
        else:
            self.q_proj = None
            self.q_a_proj = nn.Linear(cfg.d_model, cfg.q_lora_rank, bias=False)
            self.q_a_norm = norm(cfg.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, H * qk, bias=False)
        self.kv_a_proj = nn.Linear(cfg.d_model, self.kv_lora_rank + self.rope, bias=False)
        self.kv_a_norm = norm(self.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, H * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(H * self.v_dim, cfg.d_model, bias=False)
        # The backends scale by 1 / sqrt(q's width): q carries DeepSeek's extra factor.
        self.q_factor = yarn_softmax_mscale(cfg.rope_scaling)
        self.backend = ATTENTION_BACKENDS.get(cfg.attention.name)()
        self.backend.check_layer_options(None, False)
        # how the engine's prefill attends the latent cache (mla_paged.PREFILL_FORMS; tests and
        # benchmarks force one form, 'auto' picks the cheaper)
        self.prefill_form = "auto"

    def queries(self, x_BTD: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(x_BTD) if self.q_proj is not None else self.q_b_proj(self.q_a_norm(self.q_a_proj(x_BTD)))
        B, T, _ = x_BTD.shape
        return q.view(B, T, self.n_heads, self.nope + self.rope).transpose(1, 2)

    def keys_values(self, x_BTD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(k_nope_BHTn, k_rope_B1Tr before rotary, v_BHTv) expanded from the latent."""
        B, T, _ = x_BTD.shape
        latent_BTc, k_rope_BTr = self.kv_a_proj(x_BTD).split([self.kv_lora_rank, self.rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_norm(latent_BTc)).view(B, T, self.n_heads, self.nope + self.v_dim)
        k_nope_BHTn, v_BHTv = kv.transpose(1, 2).split([self.nope, self.v_dim], dim=-1)
        return k_nope_BHTn, k_rope_BTr.unsqueeze(1), v_BHTv

    def forward(self, x_BTD, cos_BTr, sin_BTr, kv_context: Any = None, attn_mask=None) -> torch.Tensor:
        if kv_context is not None and getattr(kv_context, "latent", False):
            return self.forward_latent(x_BTD, cos_BTr, sin_BTr, kv_context)
        B, T, _ = x_BTD.shape
        q_nope, q_rope = self.queries(x_BTD).split([self.nope, self.rope], dim=-1)
        k_nope_BHTn, k_rope_B1Tr, v_BHTv = self.keys_values(x_BTD)
        q_rope = rotate(q_rope, cos_BTr, sin_BTr, self.interleave)
        k_rope_B1Tr = rotate(k_rope_B1Tr, cos_BTr, sin_BTr, self.interleave)
        q_BHTk = torch.cat([q_nope, q_rope], dim=-1)
        k_BHTk = torch.cat([k_nope_BHTn, k_rope_B1Tr.expand(-1, self.n_heads, -1, -1)], dim=-1)
        if kv_context is None:
            if self.q_factor != 1.0:
                q_BHTk = q_BHTk * self.q_factor
            o_BHTv = self.backend(q_BHTk, k_BHTk, v_BHTv, causal=True, attn_mask=attn_mask)
        else:
            o_BHTv = self.attend_expanded(kv_context, q_BHTk, k_BHTk, v_BHTv)
        return self.o_proj(o_BHTv.transpose(1, 2).reshape(B, T, self.n_heads * self.v_dim))

    def forward_latent(self, x_BTD, cos_BTr, sin_BTr, kv_context: Any) -> torch.Tensor:
        """The engine's path on a latent cache (module docstring): one latent row per token written,
        then moe/attention/mla_paged.py's `LatentAttention` (absorbed decode, expanded prefill)."""
        B, T, _ = x_BTD.shape
        q_nope_BHTn, q_rope_BHTr = self.queries(x_BTD).split([self.nope, self.rope], dim=-1)
        latent_BTc, k_rope_BTr = self.kv_a_proj(x_BTD).split([self.kv_lora_rank, self.rope], dim=-1)
        q_rope_BHTr = rotate(q_rope_BHTr, cos_BTr, sin_BTr, self.interleave)
        k_rope_B1Tr = rotate(k_rope_BTr.unsqueeze(1), cos_BTr, sin_BTr, self.interleave)
        latent_BTc = self.kv_a_norm(latent_BTc)
        if getattr(getattr(self.kv_b_proj, "scheme", None), "act_fp8", False):
            # W8A8: the expanded forward feeds kv_b_proj E4M3-rounded latents; cache those, so the
            # absorbed keys and values are the same (W_UK / W_UV are the dequantised weight)
            latent_BTc = per_token_fp8_qdq(latent_BTc)
        kv_B1Tl = torch.cat([latent_BTc.unsqueeze(1), k_rope_B1Tr], dim=-1)
        w_uk_HnC, w_uv_HvC = self.absorbed_weights(kv_context, q_nope_BHTn.dtype)
        mla = LatentAttention(w_uk_HnC, w_uv_HvC, mla_softmax_scale(self.nope, self.rope, self.q_factor),
                              self.prefill_form)
        q_BHTk = torch.cat([q_nope_BHTn, q_rope_BHTr], dim=-1)
        o_BHTv = kv_context.attend(self.layer_idx, q_BHTk, kv_B1Tl, kv_B1Tl, mla=mla)
        return self.o_proj(o_BHTv.transpose(1, 2).reshape(B, T, self.n_heads * self.v_dim))

    def absorbed_weights(self, kv_context: Any, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_UK [H, nope, kv_lora_rank], W_UV [H, v, kv_lora_rank]): kv_b_proj's rows per head.
        A plain Linear gives views of its weight; a quantized one (moe/quant) its dequantised
        weight, built once per engine (`kv_context.derived`), as vLLM does for its absorbed form
        (W8A8's activation rounding of kv_b_proj's input is applied to the cached latent instead)."""
        w = self.kv_b_proj
        if isinstance(w, nn.Linear):
            weight = w.weight
        else:
            weight = kv_context.derived(("mla_kv_b", self.layer_idx), lambda: w.dequantized_weight(dtype))
        per_head = weight.view(self.n_heads, self.nope + self.v_dim, self.kv_lora_rank)
        return per_head[:, :self.nope], per_head[:, self.nope:]

    def attend_expanded(self, kv_context: Any, q_BHTk, k_BHTk, v_BHTv) -> torch.Tensor:
        """The engine's paged cache in the expanded form: q, k, v zero-padded to the cache's head
        width (the context scales by 1 / sqrt of it, so q carries the ratio to MLA's scale)."""
        D, qk = self.cache_dim, self.nope + self.rope
        q_BHTd = F.pad(q_BHTk * (self.q_factor * math.sqrt(D / qk)), (0, D - qk))
        k_BHTd, v_BHTd = F.pad(k_BHTk, (0, D - qk)), F.pad(v_BHTv, (0, D - self.v_dim))
        return kv_context.attend(self.layer_idx, q_BHTd, k_BHTd, v_BHTd)[..., :self.v_dim]
