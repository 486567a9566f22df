"""Paged attention over MLA's latent cache (moe/attention/mla.py's module docstring): the engine's
decode (absorbed) and prefill (expanded, or absorbed for short query runs), and references.

A latent cache holds per token one row `[kv_lora_rank + qk_rope_head_dim]`: the normalised latent c
and the rotated rope key, `[num_blocks, block_size, 1, width]`. With kv_b_proj's rows per head
`W_UK [H, nope, C]` and `W_UV [H, v, C]`:

- `absorbed_latent_decode`: each head's query becomes `[W_UK^T q_nope, q_rope]` (width C + rope),
  attended to the cache rows `[c, k_rope]` (`latent_decode`: kernels/mla_decode's Triton kernel,
  or a paged backend's decode with the cache read as one kv head, K and V), and W_UV maps the
  latent mix to the head's value mix. The cache is read once per sequence, whatever the head
  count: the form vLLM and FlashMLA decode in.
- `expanded_paged_decode`: the torch reference, the arithmetic of the training forward: gather
  each sequence's rows, expand them into per-head keys `[W_UK c, k_rope]` and values `W_UV c`,
  softmax. It costs heads x (nope + v) x C multiply-adds per cached token every step, which is
  what the absorbed form saves (benchmarks/mla_decode.py).
- `LatentAttention`: what the engine's kv context calls for an MLA layer on its latent cache (its
  `attend(..., mla=...)` hook, after writing the step's rows). Decode rows: absorbed, on the
  `torch` backend through its decode, on the others (CUDA) kernels/mla_decode's Triton kernel.
  Prefill rows: `expanded_paged_prefill` (vLLM's MLA prefill: each prefill sequence's cached
  latents, prefix and new rows alike, expanded once per step into per-head keys and values, then
  causal attention of width nope + rope), unless its query runs are short (speculative
  verification, small chunks), where expanding the whole prefix costs more than attending
  absorbed: `prefill_form` decides by arithmetic. The absorbed prefill (`absorbed_paged_prefill`)
  is the torch backend's varlen prefill, elsewhere the MLA kernel with one query row per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from kernels.mla_decode import mla_decode, mla_decode_torch
from kernels.mla_decode import runnable_reason as mla_runnable_reason
from kernels.paged_attention.reference import gather_cache
from moe.attention.base import allowed_mask

PREFILL_FORMS = ("auto", "expanded", "absorbed")


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


def prefill_form(max_q: int, rank: int, nope: int, v_dim: int) -> str:
    """'expanded' when expanding the context is cheaper than attending absorbed, by multiply-adds
    per cached token and head: expanded pays rank x (nope + v) once plus (nope + rope + v) per
    query, absorbed (2 rank + rope) per query; so expanded from max_q > rank (nope + v) /
    (2 rank - nope - v): 171 queries at DeepSeek-V2-Lite / V3's shapes (512, 128, 128)."""
    gain = 2 * rank - nope - v_dim
    return "expanded" if gain <= 0 or max_q * gain > rank * (nope + v_dim) else "absorbed"


def latent_decode(backend, q_lat_NHC, q_rope_NHr, cache, block_tables, context_lens, scale: float) -> torch.Tensor:
    """The latent mix [N, H, C] of absorbed queries. The `torch` backend: its paged decode given the
    cache as K and V (the `mla_decode_torch` arithmetic with its fast paths). Any other backend
    (`triton`, `flash`: their generic kernels do not take DeepSeek's 576-wide row) runs the Triton
    MLA kernel where it can (CUDA, or TRITON_INTERPRET=1 in tests), else the reference."""
    if backend.name == "torch":
        q_NHl = torch.cat([q_lat_NHC, q_rope_NHr], dim=-1)
        return backend.decode(q_NHl, cache, cache, block_tables, context_lens, scale)[..., :q_lat_NHC.shape[-1]]
    if mla_runnable_reason(cache.device) is None:
        return mla_decode(q_lat_NHC, q_rope_NHr, cache, block_tables, context_lens, scale)
    return mla_decode_torch(q_lat_NHC, q_rope_NHr, cache, block_tables, context_lens, scale)


def absorbed_latent_decode(backend, q_nope_NHn, q_rope_NHr, cache, block_tables, context_lens, w_uk_HnC, w_uv_HvC,
                           scale: float) -> torch.Tensor:
    """[N, H, v]: the engine's decode of one query per sequence (absorb, `latent_decode`, W_UV)."""
    q_lat = absorb_query(q_nope_NHn.transpose(0, 1), w_uk_HnC).transpose(0, 1)
    o_NHC = latent_decode(backend, q_lat, q_rope_NHr, cache, block_tables, context_lens, scale)
    return values_from_latent(o_NHC.transpose(0, 1), w_uv_HvC).transpose(0, 1)


def per_row_queries(block_tables, cu_seqlens_q, context_lens, n_rows: int):
    """(tables [N, max_blocks], context lengths [N]) of each prefill query row as a decode: row i of
    a sequence with q_len queries and context ctx sees ctx - q_len + i + 1 rows. No host sync."""
    q_lens = cu_seqlens_q.diff()
    seq_N = torch.repeat_interleave(torch.arange(q_lens.shape[0], device=q_lens.device), q_lens,
                                    output_size=n_rows)
    i_N = torch.arange(n_rows, device=q_lens.device) - cu_seqlens_q[seq_N]
    ctx_N = context_lens[seq_N] - q_lens[seq_N] + i_N + 1
    return block_tables[seq_N], ctx_N.to(torch.int32)


def absorbed_paged_prefill(backend, q_nope_NHn, q_rope_NHr, cache, block_tables, cu_seqlens_q, context_lens,
                           w_uk_HnC, w_uv_HvC, scale: float) -> torch.Tensor:
    """[N, H, v]: prefill rows in the absorbed form. On the `torch` backend its varlen prefill with
    the cache as one kv head (one gather per sequence); on the others each query row is a decode
    over its causal prefix (`latent_decode`: the generic prefill kernels do not fit DeepSeek's width)."""
    C = w_uk_HnC.shape[-1]
    if backend.name != "torch":
        tables_N, ctx_N = per_row_queries(block_tables, cu_seqlens_q, context_lens, q_nope_NHn.shape[0])
        return absorbed_latent_decode(backend, q_nope_NHn, q_rope_NHr, cache, tables_N, ctx_N, w_uk_HnC, w_uv_HvC,
                                      scale)
    q_lat = absorb_query(q_nope_NHn.transpose(0, 1), w_uk_HnC).transpose(0, 1)
    q_NHl = torch.cat([q_lat, q_rope_NHr], dim=-1)
    max_q = int(cu_seqlens_q.diff().max()) if cu_seqlens_q.numel() > 1 else 0
    o_NHl = backend.prefill(q_NHl, cache, cache, block_tables, cu_seqlens_q, context_lens, scale, max_q)
    return values_from_latent(o_NHl[..., :C].transpose(0, 1), w_uv_HvC).transpose(0, 1)


def expanded_paged_prefill(q_nope_NHn, q_rope_NHr, cache, block_tables, cu_seqlens_q, context_lens,
                           w_uk_HnC, w_uv_HvC, scale: float) -> torch.Tensor:
    """[N, H, v]: vLLM's MLA prefill. Per sequence (one host sync for the lengths), its `ctx` cached
    rows are expanded into per-head keys [W_UK c, k_rope] and values W_UV c, and its query rows
    (the last q_len of the context) attend them causally, bottom-right aligned, through PyTorch's
    fused attention. Memory: one sequence's expanded keys and values at a time."""
    N, H, _ = q_nope_NHn.shape
    C, bs = w_uk_HnC.shape[-1], cache.shape[1]
    out = q_nope_NHn.new_empty(N, H, w_uv_HvC.shape[1])
    bounds = zip(cu_seqlens_q[:-1].tolist(), cu_seqlens_q[1:].tolist(), context_lens.tolist())
    for s, (lo, hi, ctx) in enumerate(bounds):
        if hi == lo:
            continue
        rows_Lw = cache[block_tables[s, :-(-ctx // bs)].long()].reshape(-1, cache.shape[-1])[:ctx]
        latent_LC, k_rope_Lr = rows_Lw[:, :C].to(w_uk_HnC.dtype), rows_Lw[:, C:].to(q_nope_NHn.dtype)
        k_nope_HLn = torch.matmul(latent_LC, w_uk_HnC.transpose(1, 2)).to(q_nope_NHn.dtype)
        v_HLv = torch.matmul(latent_LC, w_uv_HvC.transpose(1, 2)).to(q_nope_NHn.dtype)
        k_HLk = torch.cat([k_nope_HLn, k_rope_Lr.expand(H, -1, -1)], dim=-1)
        q_HTk = torch.cat([q_nope_NHn[lo:hi], q_rope_NHr[lo:hi]], dim=-1).transpose(0, 1)
        causal = hi - lo == ctx
        mask = None if causal else allowed_mask(hi - lo, ctx, None, q_HTk.device)
        o_HTv = F.scaled_dot_product_attention(q_HTk, k_HLk, v_HLv, attn_mask=mask, is_causal=causal, scale=scale)
        out[lo:hi] = o_HTv.transpose(0, 1)
    return out


@dataclass
class LatentAttention:
    """One MLA layer's attention on the engine's latent cache, handed to the kv context's `attend`
    (as `mla=`), which writes the step's rows and calls this with the cache (dequantised for FP8)
    and the step's tables. q: `[N, H, nope + rope]`, rotated, unscaled; `scale` is MLA's softmax
    scale (YaRN's mscale included). `prefill`: one of PREFILL_FORMS ('auto': `prefill_form`)."""
    w_uk_HnC: torch.Tensor
    w_uv_HvC: torch.Tensor
    scale: float
    prefill: str = "auto"

    def __post_init__(self):
        if self.prefill not in PREFILL_FORMS:
            raise ValueError(f"LatentAttention.prefill must be one of {PREFILL_FORMS}; got {self.prefill!r}")

    def __call__(self, backend, q_NHk, cache, meta, decode_tables, prefill_tables) -> torch.Tensor:
        nope = self.w_uk_HnC.shape[1]
        q_nope_NHn, q_rope_NHr = q_NHk[..., :nope], q_NHk[..., nope:]
        nd, N = meta.num_decodes, q_NHk.shape[0]
        parts = []
        if nd:
            parts.append(absorbed_latent_decode(backend, q_nope_NHn[:nd], q_rope_NHr[:nd], cache, decode_tables,
                                                meta.decode_context_lens, self.w_uk_HnC, self.w_uv_HvC, self.scale))
        if nd < N:
            form = self.prefill if self.prefill != "auto" else prefill_form(
                meta.prefill_max_seqlen_q, self.w_uk_HnC.shape[-1], nope, self.w_uv_HvC.shape[1])
            run: Callable = expanded_paged_prefill if form == "expanded" else \
                lambda *a: absorbed_paged_prefill(backend, *a)
            parts.append(run(q_nope_NHn[nd:], q_rope_NHr[nd:], cache, prefill_tables, meta.prefill_cu_seqlens_q,
                             meta.prefill_context_lens, self.w_uk_HnC, self.w_uv_HvC, self.scale))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)


def mla_softmax_scale(nope: int, rope: int, q_factor: float) -> float:
    """MLA's softmax scale: (nope + rope)^-0.5 times DeepSeek's YaRN factor."""
    return q_factor / math.sqrt(nope + rope)
