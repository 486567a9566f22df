"""Paged attention: attention against a KV cache stored in fixed-size blocks.

The cache of one layer is two tensors `k_cache, v_cache: [num_blocks, block_size, n_kv_heads,
head_dim]`; a sequence's tokens live in the blocks its row of `block_tables` lists, token `t` at
block `block_tables[s, t // block_size]`, offset `t % block_size` (its *slot* is
`block * block_size + offset`). Three operations, each as a Triton kernel with a plain PyTorch
reference beside it (the `*_torch` functions, which define the semantics):

* `reshape_and_cache(k, v, k_cache, v_cache, slot_mapping)`: write new tokens' K/V (`[N, G, d]`)
  into their slots (slot < 0: skip the token).
* `paged_attention_decode(q, ..., block_tables, context_lens, scale)`: one query per sequence
  (`q: [S, H, d]`), attending to the sequence's `context_lens[s]` cached tokens. One program per
  (sequence, kv head, split) loads each K/V tile once for all `H / G` query heads of its GQA
  group; with `num_splits > 1` the context is cut in pieces processed in parallel and merged by a
  log-sum-exp reduce (flash-decoding). Accumulation is fp32 whatever the cache dtype.
* `paged_attention_prefill(q, ..., block_tables, cu_seqlens_q, context_lens, scale)`: varlen
  prefill/extend. Sequence `s` has the query rows `cu_seqlens_q[s]:cu_seqlens_q[s+1]`, which are
  the *last* `q_len` of its `context_lens[s]` tokens (their K/V already written into the cache);
  query `i` sees cache positions `<= context_lens[s] - q_len + i` (causal, bottom-right aligned).

`get_backend(name)` returns an object bundling the three for the engine: `torch` (the references;
the default on CPU), `triton` (the default on CUDA; on CPU only under `TRITON_INTERPRET=1`) and
`flash` (flash-attn's `flash_attn_with_kvcache` / `flash_attn_varlen_func` with a block table;
needs the `gpu` extra). The Triton kernels are compiled on first use, so whether they run in the
interpreter is decided by `TRITON_INTERPRET` at that moment, not at import.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Optional

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch backend still works; the Triton launchers raise a clear error
    triton = None

    class tl:  # noqa: N801  (stand-in so the kernel definitions below still parse)
        constexpr = None


FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_LOG2E = 1.4426950408889634


# ================================================================================ input checks

def _fail(msg: str):
    raise ValueError(msg)


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k_cache.dim() != 4:
        _fail(f"k_cache must be [num_blocks, block_size, n_kv_heads, head_dim]; got shape {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        _fail(f"v_cache shape {tuple(v_cache.shape)} != k_cache shape {tuple(k_cache.shape)}")
    if k_cache.dtype not in FLOAT_DTYPES or v_cache.dtype != k_cache.dtype:
        _fail(f"caches must share one dtype of {FLOAT_DTYPES}; got k {k_cache.dtype}, v {v_cache.dtype}")
    if k_cache.device != v_cache.device:
        _fail(f"k_cache is on {k_cache.device} but v_cache on {v_cache.device}")


def _check_attention(q, k_cache, v_cache, block_tables, context_lens, what: str) -> None:
    _check_cache(k_cache, v_cache)
    if q.dim() != 3:
        _fail(f"{what}: q must be [tokens, n_heads, head_dim]; got shape {tuple(q.shape)}")
    if q.dtype not in FLOAT_DTYPES:
        _fail(f"{what}: q dtype {q.dtype} is not one of {FLOAT_DTYPES}")
    H, d = q.shape[1], q.shape[2]
    G, dc = k_cache.shape[2], k_cache.shape[3]
    if d != dc:
        _fail(f"{what}: q head_dim {d} != cache head_dim {dc}")
    if H % G != 0:
        _fail(f"{what}: n_heads {H} must be a multiple of the cache's n_kv_heads {G}")
    if block_tables.dim() != 2 or block_tables.dtype != torch.int32:
        _fail(f"{what}: block_tables must be a 2-D int32 tensor [num_seqs, max_blocks]; "
              f"got {block_tables.dtype} of shape {tuple(block_tables.shape)}")
    if context_lens.dim() != 1 or context_lens.dtype != torch.int32:
        _fail(f"{what}: context_lens must be a 1-D int32 tensor [num_seqs]; "
              f"got {context_lens.dtype} of shape {tuple(context_lens.shape)}")
    if context_lens.shape[0] != block_tables.shape[0]:
        _fail(f"{what}: context_lens has {context_lens.shape[0]} sequences but block_tables "
              f"{block_tables.shape[0]}")
    for name, t in (("k_cache", k_cache), ("block_tables", block_tables), ("context_lens", context_lens)):
        if t.device != q.device:
            _fail(f"{what}: q is on {q.device} but {name} on {t.device}")


def _check_write(k, v, k_cache, v_cache, slot_mapping) -> None:
    _check_cache(k_cache, v_cache)
    G, d = k_cache.shape[2], k_cache.shape[3]
    if k.dim() != 3 or k.shape[1:] != (G, d) or v.shape != k.shape:
        _fail(f"reshape_and_cache: k and v must be [N, {G}, {d}] to fit the cache; "
              f"got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != k.shape[0]:
        _fail(f"reshape_and_cache: slot_mapping must be [N={k.shape[0]}]; got {tuple(slot_mapping.shape)}")
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        _fail(f"reshape_and_cache: slot_mapping must be int32 or int64; got {slot_mapping.dtype}")
    for name, t in (("v", v), ("k_cache", k_cache), ("slot_mapping", slot_mapping)):
        if t.device != k.device:
            _fail(f"reshape_and_cache: k is on {k.device} but {name} on {t.device}")


# ================================================================================ references

def reshape_and_cache_torch(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Reference: `cache.view(-1, G, d)[slot] = k` for every token with slot >= 0."""
    _check_write(k, v, k_cache, v_cache, slot_mapping)
    G, d = k_cache.shape[2], k_cache.shape[3]
    slots = slot_mapping.long()
    if k.shape[0] and bool((slots < 0).any()):
        keep = slots >= 0
        k, v, slots = k[keep], v[keep], slots[keep]
    k_cache.view(-1, G, d).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, G, d).index_copy_(0, slots, v.to(v_cache.dtype))


def _gather_cache(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[S, max_blocks * block_size, G, d]: each sequence's cache laid out contiguously."""
    S, B = block_tables.shape
    _, bs, G, d = cache.shape
    return cache.index_select(0, block_tables.reshape(-1).long()).view(S, B * bs, G, d)  # (faster than cache[bt])


def paged_attention_decode_torch(q, k_cache, v_cache, block_tables, context_lens, scale: float) -> torch.Tensor:
    """Reference decode: gather each sequence's blocks, mask past `context_lens`, softmax in fp32."""
    _check_attention(q, k_cache, v_cache, block_tables, context_lens, "paged_attention_decode")
    S, H, d = q.shape
    G = k_cache.shape[2]
    k = _gather_cache(k_cache, block_tables).float()  # [S, L, G, d]
    v = _gather_cache(v_cache, block_tables).float()
    scores = torch.einsum("sgrd,slgd->sgrl", q.reshape(S, G, H // G, d).float(), k) * scale
    valid = torch.arange(k.shape[1], device=q.device)[None, :] < context_lens[:, None]  # [S, L]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    out = torch.einsum("sgrl,slgd->sgrd", torch.softmax(scores, dim=-1), v)
    return out.reshape(S, H, d).to(q.dtype)


def paged_attention_prefill_torch(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale: float,
                                  max_seqlen_q: Optional[int] = None) -> torch.Tensor:
    """Reference varlen prefill: pad the queries to [S, max_q_len], gather the caches, apply the
    causal mask aligned to the end of each context, softmax in fp32, drop the padding rows."""
    _check_attention(q, k_cache, v_cache, block_tables, context_lens, "paged_attention_prefill")
    _check_cu_seqlens(q, cu_seqlens_q, context_lens)
    N, H, d = q.shape
    S, G = context_lens.shape[0], k_cache.shape[2]
    if N == 0 or S == 0:
        return q.new_empty(N, H, d)
    cu = cu_seqlens_q.long()
    q_lens = cu[1:] - cu[:-1]
    Mq = int(max_seqlen_q) if max_seqlen_q is not None else int(q_lens.max())
    j = torch.arange(Mq, device=q.device)
    valid_q = j[None, :] < q_lens[:, None]  # [S, Mq]
    rows = torch.where(valid_q, cu[:-1, None] + j[None, :], torch.zeros_like(valid_q, dtype=torch.long))
    qp = q[rows].reshape(S, Mq, G, H // G, d).float()
    k = _gather_cache(k_cache, block_tables).float()
    v = _gather_cache(v_cache, block_tables).float()
    scores = torch.einsum("smgrd,slgd->sgrml", qp, k) * scale
    q_pos = (context_lens.long() - q_lens)[:, None] + j[None, :]  # absolute position of each query
    k_pos = torch.arange(k.shape[1], device=q.device)
    mask = (k_pos[None, None, :] <= q_pos[:, :, None]) & (k_pos[None, :] < context_lens[:, None])[:, None, :]
    scores = scores.masked_fill(~mask[:, None, None], float("-inf"))
    out = torch.einsum("sgrml,slgd->smgrd", torch.softmax(scores, dim=-1), v).reshape(S, Mq, H, d)
    return out[valid_q].to(q.dtype)


def _check_cu_seqlens(q, cu_seqlens_q, context_lens) -> None:
    S = context_lens.shape[0]
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] != S + 1 or cu_seqlens_q.dtype != torch.int32:
        _fail(f"paged_attention_prefill: cu_seqlens_q must be a 1-D int32 tensor of num_seqs + 1 = {S + 1} "
              f"entries; got {cu_seqlens_q.dtype} of shape {tuple(cu_seqlens_q.shape)}")
    if cu_seqlens_q.device != q.device:
        _fail(f"paged_attention_prefill: q is on {q.device} but cu_seqlens_q on {cu_seqlens_q.device}")


# ================================================================================ Triton kernels
# The kernels are plain functions here; `_LazyKernel` jit-compiles them on first launch.

def _cache_write_kernel(K, V, KC, VC, SLOTS,
                        stride_kt, stride_kg, stride_kd, stride_vt, stride_vg, stride_vd,
                        stride_cb, stride_ct, stride_cg, stride_cd,
                        stride_vcb, stride_vct, stride_vcg, stride_vcd,
                        N_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                        BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(SLOTS + t).to(tl.int64)
    if slot >= 0:
        blk = slot // BLOCK_SIZE
        off = slot % BLOCK_SIZE
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        mask = (g[:, None] < N_KV_HEADS) & (d[None, :] < HEAD_DIM)
        k = tl.load(K + t * stride_kt + g[:, None] * stride_kg + d[None, :] * stride_kd, mask=mask)
        v = tl.load(V + t * stride_vt + g[:, None] * stride_vg + d[None, :] * stride_vd, mask=mask)
        tl.store(KC + blk * stride_cb + off * stride_ct + g[:, None] * stride_cg + d[None, :] * stride_cd,
                 k.to(KC.dtype.element_ty), mask=mask)
        tl.store(VC + blk * stride_vcb + off * stride_vct + g[:, None] * stride_vcg + d[None, :] * stride_vcd,
                 v.to(VC.dtype.element_ty), mask=mask)


def _attend_kv_tile_fn(q, KC, VC, bt_row, stride_btb, pos, mask_n, valid, kvh, d, mask_d,
                       stride_kb, stride_kt, stride_kg, stride_kd, stride_vb, stride_vt, stride_vg, stride_vd,
                       qk_scale, m_i, l_i, acc,
                       BLOCK_SIZE: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """One K/V tile of online-softmax attention, shared by the decode and prefill kernels: load
    the cache rows at positions `pos` of kv head `kvh` through the block table (each row finds its
    own block, so a tile may span several), score them against `q` (rows x head_dim; `valid` masks
    scores, [rows or 1, BLOCK_N]), and fold them into the running max `m_i`, sum `l_i` and output
    `acc` (fp32, log2 domain: `qk_scale` includes log2(e)). Returns the updated (m_i, l_i, acc)."""
    blk = tl.load(bt_row + (pos // BLOCK_SIZE) * stride_btb, mask=mask_n, other=0).to(tl.int64)
    off = pos % BLOCK_SIZE
    kv_mask = mask_n[:, None] & mask_d[None, :]
    k = tl.load(KC + blk[:, None] * stride_kb + off[:, None] * stride_kt + kvh * stride_kg + d[None, :] * stride_kd,
                mask=kv_mask, other=0.0)
    v = tl.load(VC + blk[:, None] * stride_vb + off[:, None] * stride_vt + kvh * stride_vg + d[None, :] * stride_vd,
                mask=kv_mask, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(valid, s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if IEEE:
        pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc * alpha[:, None] + pv


def _decode_kernel(Q, KC, VC, BT, CL, O, OP, LSEP,
                   qk_scale, num_splits,
                   stride_qs, stride_qh, stride_qd,
                   stride_kb, stride_kt, stride_kg, stride_kd,
                   stride_vb, stride_vt, stride_vg, stride_vd,
                   stride_bts, stride_btb,
                   stride_os, stride_oh, stride_od,
                   stride_ps, stride_ph, stride_pk, stride_pd,
                   stride_ls, stride_lh, stride_lk,
                   GROUP: tl.constexpr, BLOCK_R: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                   UPCAST: tl.constexpr, IEEE: tl.constexpr):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(CL + seq)
    # Each sequence cuts its own context in `num_splits` pieces of whole BLOCK_N tiles.
    split_len = tl.cdiv(tl.cdiv(ctx, num_splits), BLOCK_N) * BLOCK_N
    lo = split * split_len
    hi = tl.minimum(lo + split_len, ctx)

    r = tl.arange(0, BLOCK_R)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    mask_r = r < GROUP
    mask_d = d < HEAD_DIM
    heads = kvh * GROUP + r
    q = tl.load(Q + seq * stride_qs + heads[:, None] * stride_qh + d[None, :] * stride_qd,
                mask=mask_r[:, None] & mask_d[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    else:
        q = q.to(KC.dtype.element_ty)

    m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    bt_row = BT + seq * stride_bts
    for start in range(lo, hi, BLOCK_N):
        pos = start + n
        mask_n = pos < hi
        m_i, l_i, acc = _attend_kv_tile(
            q, KC, VC, bt_row, stride_btb, pos, mask_n, mask_n[None, :], kvh, d, mask_d,
            stride_kb, stride_kt, stride_kg, stride_kd, stride_vb, stride_vt, stride_vg, stride_vd,
            qk_scale, m_i, l_i, acc, BLOCK_SIZE, UPCAST, IEEE)

    out_mask = mask_r[:, None] & mask_d[None, :]
    if SPLIT:
        has = l_i > 0
        o = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        tl.store(OP + seq * stride_ps + heads[:, None] * stride_ph + split * stride_pk + d[None, :] * stride_pd,
                 o, mask=out_mask)
        tl.store(LSEP + seq * stride_ls + heads * stride_lh + split * stride_lk, lse, mask=mask_r)
    else:
        o = acc / l_i[:, None]
        tl.store(O + seq * stride_os + heads[:, None] * stride_oh + d[None, :] * stride_od,
                 o.to(O.dtype.element_ty), mask=out_mask)


def _decode_reduce_kernel(OP, LSEP, O, num_splits,
                          stride_ps, stride_ph, stride_pk, stride_pd,
                          stride_ls, stride_lh, stride_lk,
                          stride_os, stride_oh, stride_od,
                          HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr):
    seq = tl.program_id(0)
    h = tl.program_id(1)
    k = tl.arange(0, BLOCK_K)
    d = tl.arange(0, BLOCK_D)
    mask_k = k < num_splits
    lse = tl.load(LSEP + seq * stride_ls + h * stride_lh + k * stride_lk, mask=mask_k, other=float("-inf"))
    m = tl.max(lse, 0)  # finite: the first split of a non-empty context is never empty
    w = tl.exp2(lse - m)
    o = tl.load(OP + seq * stride_ps + h * stride_ph + k[:, None] * stride_pk + d[None, :] * stride_pd,
                mask=mask_k[:, None] & (d[None, :] < HEAD_DIM), other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.sum(w, 0)
    tl.store(O + seq * stride_os + h * stride_oh + d * stride_od, out.to(O.dtype.element_ty), mask=d < HEAD_DIM)


def _prefill_kernel(Q, KC, VC, BT, CUQ, CL, O, qk_scale,
                    stride_qt, stride_qh, stride_qd,
                    stride_kb, stride_kt, stride_kg, stride_kd,
                    stride_vb, stride_vt, stride_vg, stride_vd,
                    stride_bts, stride_btb,
                    stride_ot, stride_oh, stride_od,
                    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    UPCAST: tl.constexpr, IEEE: tl.constexpr):
    seq = tl.program_id(0)
    h = tl.program_id(1)
    mt = tl.program_id(2)
    q_start = tl.load(CUQ + seq)
    q_len = tl.load(CUQ + seq + 1) - q_start
    if mt * BLOCK_M < q_len:
        ctx = tl.load(CL + seq)
        prefix = ctx - q_len
        kvh = h // GROUP
        m = mt * BLOCK_M + tl.arange(0, BLOCK_M)
        d = tl.arange(0, BLOCK_D)
        n = tl.arange(0, BLOCK_N)
        mask_m = m < q_len
        mask_d = d < HEAD_DIM
        q = tl.load(Q + (q_start + m)[:, None] * stride_qt + h * stride_qh + d[None, :] * stride_qd,
                    mask=mask_m[:, None] & mask_d[None, :], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        else:
            q = q.to(KC.dtype.element_ty)
        q_pos = prefix + m  # padding rows get positions >= ctx: they see all of it, stay finite, are not stored
        hi = tl.minimum(ctx, prefix + (mt + 1) * BLOCK_M)  # the tile's last query sees up to here
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        bt_row = BT + seq * stride_bts
        for start in range(0, hi, BLOCK_N):
            pos = start + n
            mask_n = pos < hi
            causal = (pos[None, :] <= q_pos[:, None]) & mask_n[None, :]
            m_i, l_i, acc = _attend_kv_tile(
                q, KC, VC, bt_row, stride_btb, pos, mask_n, causal, kvh, d, mask_d,
                stride_kb, stride_kt, stride_kg, stride_kd, stride_vb, stride_vt, stride_vg, stride_vd,
                qk_scale, m_i, l_i, acc, BLOCK_SIZE, UPCAST, IEEE)
        o = acc / l_i[:, None]
        tl.store(O + (q_start + m)[:, None] * stride_ot + h * stride_oh + d[None, :] * stride_od,
                 o.to(O.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


# `@triton.jit` functions the kernels call, by the global name the kernels use. Like the kernels they
# are wrapped at first launch, in the mode (interpreter or compiled) of that launch: a compiled
# kernel cannot call an interpreter function, nor the reverse.
_HELPERS = {"_attend_kv_tile": _attend_kv_tile_fn}
_attend_kv_tile = None  # bound by _bind_helpers
_helpers_mode = None


def _bind_helpers(mode: bool) -> None:
    global _helpers_mode
    if _helpers_mode != mode:
        for name, fn in _HELPERS.items():
            globals()[name] = triton.jit(fn)
        _helpers_mode = mode


class _LazyKernel:
    """`triton.jit(fn)`, compiled on first launch (and again if TRITON_INTERPRET changed)."""

    def __init__(self, fn):
        self.fn, self._jitted, self._mode = fn, None, None

    def __getitem__(self, grid):
        mode = _interpreting()
        if self._jitted is None or self._mode != mode:
            _bind_helpers(mode)
            self._jitted, self._mode = triton.jit(self.fn), mode
        return self._jitted[grid]


_cache_write = _LazyKernel(_cache_write_kernel)
_decode = _LazyKernel(_decode_kernel)
_decode_reduce = _LazyKernel(_decode_reduce_kernel)
_prefill = _LazyKernel(_prefill_kernel)


def _check_triton(*tensors: torch.Tensor) -> None:
    if triton is None:
        raise RuntimeError("the Triton paged-attention kernels need the `triton` package "
                           "(pip install triton); use backend='torch' without it")
    if not _interpreting():
        for t in tensors:
            if t.device.type != "cuda":
                raise RuntimeError(f"Triton kernels run on CUDA tensors, got a tensor on {t.device}; on CPU set "
                                   "TRITON_INTERPRET=1 before the first launch (slow), or use backend='torch'")


def _pow2(x: int, lo: int = 1) -> int:
    return max(lo, 1 << (max(int(x), 1) - 1).bit_length())


def _dot_flags(dtype: torch.dtype) -> tuple[bool, bool]:
    """(UPCAST, IEEE): the interpreter's tl.dot mishandles bf16/fp16, so it computes in fp32;
    fp32 caches use exact fp32 products (not TF32) so they match the reference closely."""
    return _interpreting(), dtype == torch.float32


# ================================================================================ launchers

def reshape_and_cache(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Write `k, v: [N, G, d]` into `k_cache, v_cache` at `slot_mapping[N]` (Triton)."""
    _check_write(k, v, k_cache, v_cache, slot_mapping)
    _check_triton(k, v, k_cache, v_cache, slot_mapping)
    N = k.shape[0]
    if N == 0:
        return
    G, d, bs = k_cache.shape[2], k_cache.shape[3], k_cache.shape[1]
    _cache_write[(N,)](
        k, v, k_cache, v_cache, slot_mapping, *k.stride(), *v.stride(), *k_cache.stride(), *v_cache.stride(),
        N_KV_HEADS=G, HEAD_DIM=d, BLOCK_SIZE=bs, BLOCK_G=_pow2(G), BLOCK_D=_pow2(d))


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def default_num_splits(num_seqs: int, n_kv_heads: int, max_context: int, device: torch.device) -> int:
    """Splits so that (seqs x kv heads x splits) programs cover the GPU about twice, with at
    least 256 tokens per split; 1 off CUDA (the interpreter gains nothing from splitting)."""
    if device.type != "cuda":
        return 1
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    want = math.ceil(2 * sms / max(num_seqs * n_kv_heads, 1))
    useful = max(1, math.ceil(max_context / 256))
    return _pow2(min(want, useful, 64))


def paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale: float,
                           num_splits: Optional[int] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Decode attention (Triton): q `[S, H, d]` -> `[S, H, d]`; every context_lens[s] must be >= 1.

    `num_splits=None` picks a split count from the grid size (`default_num_splits`, bounded by
    `block_tables.shape[1] * block_size`, so no host sync is needed).
    """
    _check_attention(q, k_cache, v_cache, block_tables, context_lens, "paged_attention_decode")
    _check_triton(q, k_cache, v_cache, block_tables, context_lens)
    S, H, d = q.shape
    _, bs, G, _ = k_cache.shape
    out = torch.empty_like(q) if out is None else out
    if S == 0:
        return out
    if num_splits is None:
        num_splits = default_num_splits(S, G, block_tables.shape[1] * bs, q.device)
    if num_splits < 1:
        _fail(f"paged_attention_decode: num_splits must be >= 1; got {num_splits}")
    group = H // G
    upcast, ieee = _dot_flags(k_cache.dtype)
    block_n = 64 if d <= 128 else 32  # a tile may span several blocks: each row finds its own block
    if num_splits > 1:
        part = torch.empty(S, H, num_splits, d, dtype=torch.float32, device=q.device)
        lse = torch.empty(S, H, num_splits, dtype=torch.float32, device=q.device)
        part_strides, lse_strides = part.stride(), lse.stride()
    else:
        part = lse = out  # unused
        part_strides, lse_strides = (0, 0, 0, 0), (0, 0, 0)
    _decode[(S, G, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, part, lse,
        float(scale) * _LOG2E, num_splits,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(), *out.stride(),
        *part_strides, *lse_strides,
        GROUP=group, BLOCK_R=_pow2(group, 16), HEAD_DIM=d, BLOCK_D=_pow2(d, 16), BLOCK_SIZE=bs, BLOCK_N=block_n,
        SPLIT=num_splits > 1, UPCAST=upcast, IEEE=ieee)
    if num_splits > 1:
        _decode_reduce[(S, H)](
            part, lse, out, num_splits, *part.stride(), *lse.stride(), *out.stride(),
            HEAD_DIM=d, BLOCK_D=_pow2(d), BLOCK_K=_pow2(num_splits))
    return out


def paged_attention_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale: float,
                            max_seqlen_q: Optional[int] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Varlen prefill/extend attention (Triton): q `[N, H, d]` (rows of sequence s at
    `cu_seqlens_q[s]:cu_seqlens_q[s+1]`) -> `[N, H, d]`; see the module docstring."""
    _check_attention(q, k_cache, v_cache, block_tables, context_lens, "paged_attention_prefill")
    _check_cu_seqlens(q, cu_seqlens_q, context_lens)
    _check_triton(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens)
    N, H, d = q.shape
    S = context_lens.shape[0]
    _, bs, G, _ = k_cache.shape
    out = torch.empty_like(q) if out is None else out
    if N == 0 or S == 0:
        return out
    if max_seqlen_q is None:
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    upcast, ieee = _dot_flags(k_cache.dtype)
    interp = _interpreting()
    # exact-fp32 dots hold more registers: 64-row tiles spill at head_dim 64 on sm_90 (compile_check)
    block_m = 16 if interp else 32 if q.dtype == torch.float32 else 64
    block_n = 16 if interp else (32 if q.dtype == torch.float32 else 64)
    grid = (S, H, triton.cdiv(max_seqlen_q, block_m))
    _prefill[grid](
        q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out, float(scale) * _LOG2E,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(), *out.stride(),
        GROUP=H // G, HEAD_DIM=d, BLOCK_D=_pow2(d, 16), BLOCK_SIZE=bs, BLOCK_M=block_m, BLOCK_N=block_n,
        UPCAST=upcast, IEEE=ieee)
    return out


# ================================================================================ backends

class PagedAttentionBackend:
    """What the engine's kv context calls: `write`, `decode`, `prefill` (signatures as the
    functions above; `max_seqlen_q` is a host int the engine already knows)."""

    name = "base"

    def check_config(self, block_size: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        """Raise ValueError if this backend cannot serve such a cache."""

    def write(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        raise NotImplementedError

    def decode(self, q, k_cache, v_cache, block_tables, context_lens, scale):
        raise NotImplementedError

    def prefill(self, q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, max_seqlen_q):
        raise NotImplementedError


def paged_attention_prefill_sdpa(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens,
                                 scale: float) -> torch.Tensor:
    """Same as `paged_attention_prefill_torch`, one sequence at a time through PyTorch's
    fused attention (memory O(tokens), not O(seqs x max_q x max_kv)); one host sync."""
    import torch.nn.functional as F

    _check_attention(q, k_cache, v_cache, block_tables, context_lens, "paged_attention_prefill")
    _check_cu_seqlens(q, cu_seqlens_q, context_lens)
    N, H, d = q.shape
    _, bs, G, _ = k_cache.shape
    out = torch.empty_like(q)
    for s, (lo, hi, ctx) in enumerate(zip(cu_seqlens_q[:-1].tolist(), cu_seqlens_q[1:].tolist(),
                                          context_lens.tolist())):
        if hi == lo:
            continue
        blocks = block_tables[s, :-(-ctx // bs)].long()
        k = k_cache[blocks].reshape(-1, G, d)[:ctx].transpose(0, 1).unsqueeze(0)  # [1, G, ctx, d]
        v = v_cache[blocks].reshape(-1, G, d)[:ctx].transpose(0, 1).unsqueeze(0)
        qs = q[lo:hi].transpose(0, 1).unsqueeze(0)  # [1, H, q_len, d]
        if hi - lo == ctx:
            mask, causal = None, True
        else:  # queries are the last q_len positions: bottom-right aligned causal mask
            mask = torch.ones(hi - lo, ctx, dtype=torch.bool, device=q.device).tril(ctx - (hi - lo))
            causal = False
        o = F.scaled_dot_product_attention(qs.to(k.dtype), k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                           enable_gqa=H != G)
        out[lo:hi] = o[0].transpose(0, 1).to(q.dtype)
    return out


class TorchBackend(PagedAttentionBackend):
    """The gather-based PyTorch references (any device, any dtype). Prefills whose padded score
    tensor (seqs x heads x max_q x max_kv) would exceed `max_padded_scores` elements run one
    sequence at a time through fused attention instead."""

    name = "torch"
    max_padded_scores = 1 << 24

    def write(self, k, v, k_cache, v_cache, slot_mapping):
        reshape_and_cache_torch(k, v, k_cache, v_cache, slot_mapping)

    def decode(self, q, k_cache, v_cache, block_tables, context_lens, scale):
        return paged_attention_decode_torch(q, k_cache, v_cache, block_tables, context_lens, scale)

    def prefill(self, q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, max_seqlen_q):
        padded = block_tables.shape[0] * q.shape[1] * max_seqlen_q * block_tables.shape[1] * k_cache.shape[1]
        if padded > self.max_padded_scores:
            return paged_attention_prefill_sdpa(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale)
        return paged_attention_prefill_torch(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale,
                                             max_seqlen_q)


class TritonBackend(PagedAttentionBackend):
    name = "triton"

    def __init__(self, num_splits: Optional[int] = None):
        self.num_splits = num_splits

    def check_config(self, block_size, head_dim, dtype, device):
        if triton is None:
            raise ValueError("attention_backend='triton' needs the `triton` package (pip install triton)")
        if device.type != "cuda" and not _interpreting():
            raise ValueError(f"attention_backend='triton' needs a CUDA device (got {device}); on CPU set "
                             "TRITON_INTERPRET=1 (slow, for tests) or use attention_backend='torch'")

    def write(self, k, v, k_cache, v_cache, slot_mapping):
        reshape_and_cache(k, v, k_cache, v_cache, slot_mapping)

    def decode(self, q, k_cache, v_cache, block_tables, context_lens, scale):
        return paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale, self.num_splits)

    def prefill(self, q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, max_seqlen_q):
        return paged_attention_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale,
                                       max_seqlen_q)


def _import_flash_attn():
    try:
        from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
    except ImportError as e:
        raise ImportError("attention_backend='flash' needs flash-attn, which is not installed: "
                          "pip install -e '.[gpu]' (the `gpu` extra, flash-attn>=2.6)") from e
    return flash_attn_with_kvcache, flash_attn_varlen_func


class FlashBackend(PagedAttentionBackend):
    """flash-attn 2 with a block table: `flash_attn_with_kvcache` for decode and
    `flash_attn_varlen_func(..., block_table=...)` for prefill; cache writes use Triton."""

    name = "flash"

    def __init__(self):
        import inspect

        self._with_kvcache, self._varlen = _import_flash_attn()
        if "block_table" not in inspect.signature(self._varlen).parameters:
            raise ImportError("attention_backend='flash' needs flash-attn >= 2.6 (flash_attn_varlen_func with a "
                              "block_table): pip install -U 'flash-attn>=2.6' (the `gpu` extra)")

    def check_config(self, block_size, head_dim, dtype, device):
        if device.type != "cuda":
            raise ValueError(f"attention_backend='flash' needs a CUDA device; got {device}")
        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"attention_backend='flash' needs an fp16/bf16 model and cache; got {dtype}")
        if block_size % 256 != 0:
            raise ValueError(f"attention_backend='flash' needs block_size to be a multiple of 256 (flash-attn's "
                             f"paged KV limit); got block_size={block_size}. Use block_size=256 or "
                             "attention_backend='triton'")

    def write(self, k, v, k_cache, v_cache, slot_mapping):
        reshape_and_cache(k, v, k_cache, v_cache, slot_mapping)

    def decode(self, q, k_cache, v_cache, block_tables, context_lens, scale):
        out = self._with_kvcache(q.unsqueeze(1), k_cache, v_cache, cache_seqlens=context_lens,
                                 block_table=block_tables, softmax_scale=scale, causal=True)
        return out.squeeze(1)

    def prefill(self, q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, max_seqlen_q):
        cu_k = torch.nn.functional.pad(torch.cumsum(context_lens, 0, dtype=torch.int32), (1, 0))
        max_k = block_tables.shape[1] * k_cache.shape[1]
        return self._varlen(q, k_cache, v_cache, cu_seqlens_q, cu_k, max_seqlen_q, max_k, softmax_scale=scale,
                            causal=True, block_table=block_tables)


BACKENDS = {"torch": TorchBackend, "triton": TritonBackend, "flash": FlashBackend}


def get_backend(name: str = "auto", device: Optional[torch.device] = None) -> PagedAttentionBackend:
    """A backend by name; "auto" is `triton` on CUDA (when installed) and `torch` elsewhere."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if name == "auto":
        name = "triton" if device.type == "cuda" and triton is not None else "torch"
    if name not in BACKENDS:
        raise ValueError(f"attention_backend={name!r} is not one of {['auto', *BACKENDS]}")
    return BACKENDS[name]()
