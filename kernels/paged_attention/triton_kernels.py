"""The Triton kernels of paged attention, as plain functions, and their lazily jitted handles
(`kernels.runtime.LazyJit`: compiled on first launch, in the mode TRITON_INTERPRET selects then).

`_attend_kv_tile` is a `@triton.jit` helper the decode and prefill kernels call by that global
name; `HELPERS` lists it, and `LazyJit` binds the helper of the launch's mode under the name (a
compiled kernel cannot call an interpreter function, nor the reverse).
"""

from __future__ import annotations

from kernels.runtime import LazyJit, tl


def _offset_fn(i, stride):
    """`i * stride` in int64. Program ids and loaded int32 indices times a stride are int32 products
    in Triton, which wrap past 2**31 elements: a packed qkv row of (32 + 2*8) heads x 128 is 6144
    elements, so a token index past ~350k would address the wrong row. Every row offset of a token,
    sequence or head index goes through this helper (called by its global name `_offset`)."""
    return i.to(tl.int64) * stride


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
        k = tl.load(K + _offset(t, stride_kt) + g[:, None] * stride_kg + d[None, :] * stride_kd, mask=mask)
        v = tl.load(V + _offset(t, stride_vt) + g[:, None] * stride_vg + d[None, :] * stride_vd, mask=mask)
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
    # a row that has seen no valid key yet (a window starting past this tile) keeps m = -inf: subtract
    # 0 instead, so its alpha and p are 0, not exp2(-inf - -inf) = NaN
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if IEEE:
        pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc * alpha[:, None] + pv


def _decode_kernel(Q, KC, VC, BT, CL, O, OP, LSEP, SINKS,
                   qk_scale, num_splits, window,
                   stride_qs, stride_qh, stride_qd,
                   stride_kb, stride_kt, stride_kg, stride_kd,
                   stride_vb, stride_vt, stride_vg, stride_vd,
                   stride_bts, stride_btb,
                   stride_os, stride_oh, stride_od,
                   stride_ps, stride_ph, stride_pk, stride_pd,
                   stride_ls, stride_lh, stride_lk,
                   GROUP: tl.constexpr, BLOCK_R: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                   HAS_WINDOW: tl.constexpr, HAS_SINKS: tl.constexpr,
                   UPCAST: tl.constexpr, IEEE: tl.constexpr):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(CL + seq)
    # The query (position ctx - 1) sees positions vis .. ctx - 1: all of them, or the window's. Positions
    # before `vis` are never loaded, so their block-table entries may be released ones (NULL_BLOCK).
    vis = tl.maximum(ctx - window, 0) if HAS_WINDOW else 0
    # Each sequence cuts its own visible context in `num_splits` pieces of whole BLOCK_N tiles.
    split_len = tl.cdiv(tl.cdiv(ctx - vis, num_splits), BLOCK_N) * BLOCK_N
    lo = vis + split * split_len
    hi = tl.minimum(lo + split_len, ctx)

    r = tl.arange(0, BLOCK_R)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    mask_r = r < GROUP
    mask_d = d < HEAD_DIM
    heads = kvh * GROUP + r
    q = tl.load(Q + _offset(seq, stride_qs) + _offset(heads[:, None], stride_qh) + d[None, :] * stride_qd,
                mask=mask_r[:, None] & mask_d[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    else:
        q = q.to(KC.dtype.element_ty)

    m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    bt_row = BT + _offset(seq, stride_bts)
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
        tl.store(OP + _offset(seq, stride_ps) + _offset(heads[:, None], stride_ph) + split * stride_pk
                 + d[None, :] * stride_pd, o, mask=out_mask)
        tl.store(LSEP + _offset(seq, stride_ls) + _offset(heads, stride_lh) + split * stride_lk, lse, mask=mask_r)
    else:
        if HAS_SINKS:  # the sink logit joins the denominator (log2 domain, relative to the running max)
            sink = tl.load(SINKS + heads, mask=mask_r, other=float("-inf")).to(tl.float32) * 1.4426950408889634
            l_i = l_i + tl.exp2(sink - m_i)
        o = acc / l_i[:, None]
        tl.store(O + _offset(seq, stride_os) + _offset(heads[:, None], stride_oh) + d[None, :] * stride_od,
                 o.to(O.dtype.element_ty), mask=out_mask)


def _decode_reduce_kernel(OP, LSEP, O, SINKS, num_splits,
                          stride_ps, stride_ph, stride_pk, stride_pd,
                          stride_ls, stride_lh, stride_lk,
                          stride_os, stride_oh, stride_od,
                          HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
                          HAS_SINKS: tl.constexpr):
    seq = tl.program_id(0)
    h = tl.program_id(1)
    k = tl.arange(0, BLOCK_K)
    d = tl.arange(0, BLOCK_D)
    mask_k = k < num_splits
    lse = tl.load(LSEP + _offset(seq, stride_ls) + _offset(h, stride_lh) + k * stride_lk, mask=mask_k,
                  other=float("-inf"))
    m = tl.max(lse, 0)  # finite: the first split of a non-empty context is never empty
    w = tl.exp2(lse - m)
    o = tl.load(OP + _offset(seq, stride_ps) + _offset(h, stride_ph) + k[:, None] * stride_pk + d[None, :] * stride_pd,
                mask=mask_k[:, None] & (d[None, :] < HEAD_DIM), other=0.0)
    den = tl.sum(w, 0)
    if HAS_SINKS:  # head h's sink logit joins the denominator once, over all splits
        den = den + tl.exp2(tl.load(SINKS + h).to(tl.float32) * 1.4426950408889634 - m)
    out = tl.sum(o * w[:, None], 0) / den
    tl.store(O + _offset(seq, stride_os) + _offset(h, stride_oh) + d * stride_od, out.to(O.dtype.element_ty),
             mask=d < HEAD_DIM)


def _prefill_kernel(Q, KC, VC, BT, CUQ, CL, O, SINKS, qk_scale, window,
                    stride_qt, stride_qh, stride_qd,
                    stride_kb, stride_kt, stride_kg, stride_kd,
                    stride_vb, stride_vt, stride_vg, stride_vd,
                    stride_bts, stride_btb,
                    stride_ot, stride_oh, stride_od,
                    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    HAS_WINDOW: tl.constexpr, HAS_SINKS: tl.constexpr,
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
        q = tl.load(Q + _offset((q_start + m)[:, None], stride_qt) + _offset(h, stride_qh) + d[None, :] * stride_qd,
                    mask=mask_m[:, None] & mask_d[None, :], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        else:
            q = q.to(KC.dtype.element_ty)
        q_pos = prefix + m  # padding rows get positions >= ctx: they see all of it, stay finite, are not stored
        hi = tl.minimum(ctx, prefix + (mt + 1) * BLOCK_M)  # the tile's last query sees up to here
        # with a window, the tile's first query sees from here on (earlier entries may be released blocks)
        lo = tl.maximum(prefix + mt * BLOCK_M - window + 1, 0) if HAS_WINDOW else 0
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        bt_row = BT + _offset(seq, stride_bts)
        for start in range(lo, hi, BLOCK_N):
            pos = start + n
            mask_n = pos < hi
            causal = (pos[None, :] <= q_pos[:, None]) & mask_n[None, :]
            if HAS_WINDOW:
                causal = causal & (pos[None, :] > q_pos[:, None] - window)
            m_i, l_i, acc = _attend_kv_tile(
                q, KC, VC, bt_row, stride_btb, pos, mask_n, causal, kvh, d, mask_d,
                stride_kb, stride_kt, stride_kg, stride_kd, stride_vb, stride_vt, stride_vg, stride_vd,
                qk_scale, m_i, l_i, acc, BLOCK_SIZE, UPCAST, IEEE)
        if HAS_SINKS:
            l_i = l_i + tl.exp2(tl.load(SINKS + h).to(tl.float32) * 1.4426950408889634 - m_i)
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # (l = 0 only on padding rows, which are not stored)
        tl.store(O + _offset((q_start + m)[:, None], stride_ot) + _offset(h, stride_oh) + d[None, :] * stride_od,
                 o.to(O.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


# `@triton.jit` functions the kernels call, by the global name the kernels use.
HELPERS = {"_attend_kv_tile": _attend_kv_tile_fn, "_offset": _offset_fn}
_attend_kv_tile = _offset = None  # bound by LazyJit before each launch

cache_write = LazyJit(_cache_write_kernel, HELPERS)
decode = LazyJit(_decode_kernel, HELPERS)
decode_reduce = LazyJit(_decode_reduce_kernel, HELPERS)
prefill = LazyJit(_prefill_kernel, HELPERS)
