"""Paged decode over MLA's latent cache, both ways (moe/attention/mla.py's module docstring).

A latent cache holds per token one row `[kv_lora_rank + qk_rope_head_dim]`: the normalised latent c
and the rotated rope key, `[num_blocks, block_size, 1, width]`. With kv_b_proj's rows per head
`W_UK [H, nope, C]` and `W_UV [H, v, C]`:

- `absorbed_paged_decode`: each head's query becomes `[W_UK^T q_nope, q_rope]` (width C + rope),
  a paged backend attends it to the cache as multi-query attention (one kv head, the cache read
  as K and as V), and W_UV maps the first C dims of the output to the head's value mix. The
  cache is read once per sequence, whatever the head count: the form vLLM and FlashMLA decode in.
- `expanded_paged_decode`: the torch reference, the arithmetic of the training forward: gather
  each sequence's rows, expand them into per-head keys `[W_UK c, k_rope]` and values `W_UV c`,
  softmax. It costs heads x (nope + v) x C multiply-adds per cached token every step, which is
  what the absorbed form saves (benchmarks/mla_decode.py).
"""

from __future__ import annotations

import torch

from kernels.paged_attention.reference import gather_cache


def per_token_fp8_qdq(x: torch.Tensor) -> torch.Tensor:
    """Dynamic per-token E4M3 quantize-dequantize (scale = token amax / 448): what a W8A8 (`fp8`
    scheme) kv_b_proj does to its input. Written here because the variants layer may not import
    moe/quant (docs/architecture.md); tests/attention/test_mla_paged.py holds it equal to
    `moe.quant.schemes.base.quantize_activation`."""
    x32 = x.float()
    scale = (x32.abs().amax(-1, keepdim=True) / 448.0).clamp(min=1e-12)
    return ((x32 / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * scale).to(x.dtype)


def absorb_query(q_nope_BHTn: torch.Tensor, w_uk_HnC: torch.Tensor) -> torch.Tensor:
    """W_UK^T q_nope per head: [..., H, T, nope] -> [..., H, T, C] (the score q_nope . W_UK c = this . c)."""
    return torch.einsum("...htn,hnc->...htc", q_nope_BHTn, w_uk_HnC)


def values_from_latent(o_BHTc: torch.Tensor, w_uv_HvC: torch.Tensor) -> torch.Tensor:
    """W_UV per head on a latent mix sum_j p_j c_j: [..., H, T, C] -> [..., H, T, v]."""
    return torch.einsum("...htc,hvc->...htv", o_BHTc, w_uv_HvC)


def absorbed_paged_decode(decode, q_nope_NHn, q_rope_NHr, cache, block_tables, context_lens, w_uk_HnC, w_uv_HvC,
                          scale: float) -> torch.Tensor:
    """[N, H, v] for one query per sequence; `decode` is a paged backend's decode (q, k_cache,
    v_cache, block_tables, context_lens, scale), given the cache as both K and V."""
    C = w_uk_HnC.shape[-1]
    q_NHl = torch.cat([absorb_query(q_nope_NHn.transpose(0, 1), w_uk_HnC).transpose(0, 1), q_rope_NHr], dim=-1)
    o_NHl = decode(q_NHl, cache, cache, block_tables, context_lens, scale)
    return values_from_latent(o_NHl[..., :C].transpose(0, 1), w_uv_HvC).transpose(0, 1)


def expanded_paged_decode(q_nope_NHn, q_rope_NHr, cache, block_tables, context_lens, w_uk_HnC, w_uv_HvC,
                          scale: float) -> torch.Tensor:
    """The reference: per-head keys and values expanded from the gathered latent rows, fp32 softmax."""
    C = w_uk_HnC.shape[-1]
    rows_NLl = gather_cache(cache, block_tables)[:, :, 0].float()
    latent_NLC, k_rope_NLr = rows_NLl[..., :C], rows_NLl[..., C:]
    k_nope_NHLn = torch.einsum("slc,hnc->shln", latent_NLC, w_uk_HnC.float())
    v_NHLv = torch.einsum("slc,hvc->shlv", latent_NLC, w_uv_HvC.float())
    scores_NHL = (torch.einsum("shn,shln->shl", q_nope_NHn.float(), k_nope_NHLn)
                  + torch.einsum("shr,slr->shl", q_rope_NHr.float(), k_rope_NLr)) * scale
    valid_NL = torch.arange(rows_NLl.shape[1], device=cache.device)[None, :] < context_lens[:, None]
    p_NHL = torch.softmax(scores_NHL.masked_fill(~valid_NL[:, None, :], float("-inf")), dim=-1)
    return torch.einsum("shl,shlv->shv", p_NHL, v_NHLv).to(q_nope_NHn.dtype)
