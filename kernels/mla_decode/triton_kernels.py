"""The Triton kernel of MLA's absorbed paged decode, as a plain function and its lazy jit.

One program per (sequence, tile of BLOCK_H heads, split of the context). It holds its heads'
absorbed queries (`[BLOCK_H, C]` latent part and `[BLOCK_H, R]` rope part) and walks its piece of
the context in tiles of BLOCK_N cached rows: the latent tile `c [BLOCK_N, C]` is loaded once and
used twice, as the keys (scores q_latent . c + q_rope . k_rope) and as the values (the output is
the latent mix sum_j p_j c_j), so a tile's bytes are read once for all BLOCK_H heads. The generic
paged kernel instead took a whole GQA group of 128 heads and the 576-wide row padded to 1024 as
one tile (524 KB of shared memory); here the head tile is 16 rows and the latent and rope parts
are separate pow2 tiles (512 + 64, nothing padded at DeepSeek's shapes). With splits the partial
outputs and their log-sum-exp go to fp32 buffers, merged by paged attention's reduce kernel.
"""

from __future__ import annotations

from kernels.paged_attention.triton_kernels import _offset_fn
from kernels.runtime import LazyJit, tl


def _mla_tile_fn(ql, qr, KV, bt_row, stride_btb, pos, mask_n, c, r, mask_c, mask_r,
                 stride_kb, stride_kt, stride_kd, qk_scale, m_i, l_i, acc,
                 RANK: tl.constexpr, BLOCK_SIZE: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """One tile of cached rows at positions `pos` (each row finds its block through the table):
    scores of the latent and rope parts, folded into the running max `m_i`, sum `l_i` and latent
    mix `acc` (fp32, log2 domain: `qk_scale` includes log2(e)). Returns the updated (m_i, l_i, acc)."""
    blk = tl.load(bt_row + (pos // BLOCK_SIZE) * stride_btb, mask=mask_n, other=0).to(tl.int64)
    row = KV + blk * stride_kb + (pos % BLOCK_SIZE) * stride_kt  # [BLOCK_N] row starts
    lat = tl.load(row[:, None] + c[None, :] * stride_kd, mask=mask_n[:, None] & mask_c[None, :], other=0.0)
    kr = tl.load(row[:, None] + (RANK + r[None, :]) * stride_kd, mask=mask_n[:, None] & mask_r[None, :], other=0.0)
    if UPCAST:
        lat = lat.to(tl.float32)
        kr = kr.to(tl.float32)
    if IEEE:
        s = tl.dot(ql, tl.trans(lat), input_precision="ieee") + tl.dot(qr, tl.trans(kr), input_precision="ieee")
    else:
        s = tl.dot(ql, tl.trans(lat)) + tl.dot(qr, tl.trans(kr))
    s = tl.where(mask_n[None, :], s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if IEEE:  # the latent tile is the value too: read once
        pv = tl.dot(p.to(lat.dtype), lat, input_precision="ieee")
    else:
        pv = tl.dot(p.to(lat.dtype), lat)
    return m_new, l_i, acc * alpha[:, None] + pv


def _mla_decode_kernel(QL, QR, KV, BT, CL, O, OP, LSEP,
                       qk_scale, num_splits, n_heads,
                       stride_qls, stride_qlh, stride_qlc,
                       stride_qrs, stride_qrh, stride_qrr,
                       stride_kb, stride_kt, stride_kd,
                       stride_bts, stride_btb,
                       stride_os, stride_oh, stride_oc,
                       stride_ps, stride_ph, stride_pk, stride_pc,
                       stride_ls, stride_lh, stride_lk,
                       RANK: tl.constexpr, ROPE: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr,
                       BLOCK_H: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                       SPLIT: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    seq = tl.program_id(0)
    hb = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(CL + seq)
    # each sequence cuts its own context in `num_splits` pieces of whole BLOCK_N tiles
    split_len = tl.cdiv(tl.cdiv(ctx, num_splits), BLOCK_N) * BLOCK_N
    lo = split * split_len
    hi = tl.minimum(lo + split_len, ctx)

    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    c = tl.arange(0, BLOCK_C)
    r = tl.arange(0, BLOCK_R)
    n = tl.arange(0, BLOCK_N)
    mask_h = heads < n_heads
    mask_c = c < RANK
    mask_r = r < ROPE
    ql = tl.load(QL + _offset(seq, stride_qls) + _offset(heads[:, None], stride_qlh) + c[None, :] * stride_qlc,
                 mask=mask_h[:, None] & mask_c[None, :], other=0.0)
    qr = tl.load(QR + _offset(seq, stride_qrs) + _offset(heads[:, None], stride_qrh) + r[None, :] * stride_qrr,
                 mask=mask_h[:, None] & mask_r[None, :], other=0.0)
    if UPCAST:  # the interpreter's tl.dot is wrong for 16-bit tiles
        ql = ql.to(tl.float32)
        qr = qr.to(tl.float32)
    else:
        ql = ql.to(KV.dtype.element_ty)
        qr = qr.to(KV.dtype.element_ty)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)
    bt_row = BT + _offset(seq, stride_bts)
    for start in range(lo, hi, BLOCK_N):
        pos = start + n
        m_i, l_i, acc = _mla_tile(ql, qr, KV, bt_row, stride_btb, pos, pos < hi, c, r, mask_c, mask_r,
                                  stride_kb, stride_kt, stride_kd, qk_scale, m_i, l_i, acc,
                                  RANK, BLOCK_SIZE, UPCAST, IEEE)

    out_mask = mask_h[:, None] & mask_c[None, :]
    if SPLIT:  # an empty split (its piece starts past the context) stores lse -inf and zeros
        has = l_i > 0
        o = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        tl.store(OP + _offset(seq, stride_ps) + _offset(heads[:, None], stride_ph) + split * stride_pk
                 + c[None, :] * stride_pc, o, mask=out_mask)
        tl.store(LSEP + _offset(seq, stride_ls) + _offset(heads, stride_lh) + split * stride_lk, lse, mask=mask_h)
    else:
        o = acc / l_i[:, None]
        tl.store(O + _offset(seq, stride_os) + _offset(heads[:, None], stride_oh) + c[None, :] * stride_oc,
                 o.to(O.dtype.element_ty), mask=out_mask)


HELPERS = {"_offset": _offset_fn, "_mla_tile": _mla_tile_fn}
_offset = _mla_tile = None  # bound by LazyJit before each launch

mla_decode = LazyJit(_mla_decode_kernel, HELPERS)
