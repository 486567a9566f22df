"""The weight-only quantized GEMM kernels, as plain functions (`launch.py` jit-compiles them on first
launch and, on CUDA, wraps them in the autotuner of `configs.py`).

Both kernels stream the *stored* weight (int8 codes, packed int4 nibbles or E4M3 bytes) and its
scales, dequantise one `[BLOCK_K, BLOCK_N]` tile at a time in registers (`_dequant_tile`: fp32 math,
then rounded to the activations' dtype, exactly as the PyTorch dequantise-then-matmul path rounds
its dequantised weight), and feed it to `tl.dot` with an fp32 accumulator. All row/column offsets
are int64, so `[E, O, I]` expert stacks and long token batches past 2**31 elements address correctly.

* `_quant_linear_kernel`: `y[m] = x[m] @ deq(W)^T (+ bias)`, one `BLOCK_M x BLOCK_N` tile per program.
* `_quant_gather_kernel`: the expert gather-GEMM on the routing of `kernels.moe_gemm` (row blocks
  never straddle experts): `y[out(p)] = scale[p] * x[in(p)] @ deq(W[e_p])^T`, input rows gathered by
  token index, output rows grouped or scattered to `t * K + k`; the dropped group writes zeros.

FMT (constexpr): 0 = int8 (symmetric, one scale per output row), 1 = int4 (two codes per byte, low
nibble first; per (row, group of GROUP inputs) an fp32 scale and a uint8 zero point), 2 = fp8
(E4M3 bytes, one scale per output row), decoded with integer arithmetic rather than
`tl.float8e4nv` so that it compiles for sm_80 (no FP8 conversions before sm_89); the values are
identical (E4M3 is exact in fp32). 3 = W8A8 FP8 on tensor cores (sm_89+): X holds E4M3 activations
with one fp32 scale per row (XS), the weight bytes go to `tl.dot` as `tl.float8e4nv` undecoded, and
both scales multiply the fp32 accumulator after the dot.
"""

from __future__ import annotations

from kernels.moe_gemm.triton_kernels import _mma_fn, _row_block_fn
from kernels.runtime import tl


def _dequant_tile_fn(QW, WS, WZ, q_base, s_base, n, k0, mask_n, K_IN, stride_qn, stride_sn,
                     FMT: tl.constexpr, GROUP: tl.constexpr, DTYPE: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    """deq(W)[n, k0:k0 + BLOCK_K] as a `[BLOCK_K, BLOCK_N]` tile (k down, n across) in DTYPE; 0 outside
    the weight. `q_base` / `s_base`: int64 offsets of this expert's codes / scales; n int64."""
    kk = k0 + tl.arange(0, BLOCK_K).to(tl.int64)
    mask_k = kk < K_IN
    mask = mask_k[:, None] & mask_n[None, :]
    col_q = n[None, :] * stride_qn
    if FMT == 3:  # W8A8: the E4M3 bytes as tl.float8e4nv for an FP8 tensor-core dot; scales after the dot
        return tl.load(QW + q_base + col_q + kk[:, None], mask=mask, other=0).to(tl.float8e4nv, bitcast=True)
    if FMT == 1:
        # k0 is even (BLOCK_K is), so the tile's codes are BLOCK_K / 2 whole bytes: load each byte
        # once and interleave its low (even k) and high (odd k) nibbles. Bytes past the row's codes
        # are never read (2j < K_IN); a last odd code's padding nibble meets a zero input.
        j = k0 // 2 + tl.arange(0, BLOCK_K // 2).to(tl.int64)
        byte = tl.load(QW + q_base + col_q + j[:, None], mask=((2 * j) < K_IN)[:, None] & mask_n[None, :],
                       other=0).to(tl.int32)
        code = tl.reshape(tl.permute(tl.join(byte & 15, byte >> 4), (0, 2, 1)), (BLOCK_K, BLOCK_N))
        if GROUP % BLOCK_K == 0:  # the tile lies in one group: one scale and zero per column
            s_off = s_base + n * stride_sn + k0 // GROUP
            s = tl.load(WS + s_off, mask=mask_n, other=0.0)[None, :]
            z = tl.load(WZ + s_off, mask=mask_n, other=0).to(tl.float32)[None, :]
        else:  # groups straddle tiles (small groups, or the interpreter's tiles): per element
            s_off = s_base + n[None, :] * stride_sn + (kk // GROUP)[:, None]
            s = tl.load(WS + s_off, mask=mask, other=0.0)
            z = tl.load(WZ + s_off, mask=mask, other=0).to(tl.float32)
        w = (code.to(tl.float32) - z) * s
    else:
        s = tl.load(WS + s_base + n * stride_sn, mask=mask_n, other=0.0)
        if FMT == 0:
            q = tl.load(QW + q_base + col_q + kk[:, None], mask=mask, other=0).to(tl.float32)
        else:
            b = tl.load(QW + q_base + col_q + kk[:, None], mask=mask, other=0).to(tl.int32)
            e = (b >> 3) & 15
            m = b & 7
            # normal: 2^(e-7) * (1 + m/8), built as the fp32 bit pattern (exponent e - 7 + 127, the
            # 3 mantissa bits on top of fp32's 23); subnormal (e == 0): m * 2^-9. Both exact.
            # 0x7f / 0xff (NaN) are never stored: the scheme clamps to +-448.
            normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
            mag = tl.where(e > 0, normal, m.to(tl.float32) * 0.001953125)
            q = tl.where((b & 128) != 0, -mag, mag)
        w = q * s[None, :]
    return w.to(DTYPE)


def _quant_linear_kernel(X, XS, QW, WS, WZ, BIAS, Y, M, N_OUT, K_IN, M_BUCKET,
                         stride_xm, stride_qn, stride_sn, stride_ym,
                         FMT: tl.constexpr, GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr,
                         IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K).to(tl.int64)
    mask_m = m < M
    mask_n = n < N_OUT
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K_IN, BLOCK_K):
        kk = k0 + k
        mask_k = kk < K_IN
        xt = tl.load(X + m[:, None] * stride_xm + kk[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        wt = _dequant_tile(QW, WS, WZ, 0, 0, n, k0, mask_n, K_IN, stride_qn, stride_sn, FMT, GROUP,
                           X.dtype.element_ty, BLOCK_N, BLOCK_K)
        acc = _mma(acc, xt, wt, UPCAST, IEEE)
    if FMT == 3:  # y = (xq . wq) * x_scale[m] * w_scale[n]
        xs = tl.load(XS + m, mask=mask_m, other=0.0)
        acc = acc * xs[:, None] * tl.load(WS + n * stride_sn, mask=mask_n, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(BIAS + n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + m[:, None] * stride_ym + n[None, :], acc.to(Y.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


def _quant_gather_kernel(X, XS, QW, WS, WZ, Y, IN_IDX, OUT_IDX, SCALE, BLOCK_GROUP, BLOCK_START, GROUP_OFFS,
                         N_OUT, K_IN, n_experts, stride_xm, stride_qe, stride_qn, stride_se, stride_sn, stride_ym,
                         X_GROUPED: tl.constexpr, Y_GROUPED: tl.constexpr, HAS_SCALE: tl.constexpr,
                         FMT: tl.constexpr, GROUP: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    grp = tl.load(BLOCK_GROUP + pid_m)
    if grp >= 0:
        real, p, mask_m, mask_mr, in_rows, out_rows = _row_block(
            grp, pid_m, BLOCK_START, GROUP_OFFS, IN_IDX, OUT_IDX, n_experts, X_GROUPED, Y_GROUPED, BLOCK_M)
        n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
        k = tl.arange(0, BLOCK_K).to(tl.int64)
        mask_n = n < N_OUT
        e64 = tl.where(real, grp, 0).to(tl.int64)
        q_base = e64 * stride_qe
        s_base = e64 * stride_se
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        k_hi = tl.where(real, K_IN, 0)
        for k0 in range(0, k_hi, BLOCK_K):
            kk = k0 + k
            mask_k = kk < K_IN
            xt = tl.load(X + in_rows[:, None] * stride_xm + kk[None, :], mask=mask_m[:, None] & mask_k[None, :],
                         other=0.0)
            wt = _dequant_tile(QW, WS, WZ, q_base, s_base, n, k0, mask_n, K_IN, stride_qn, stride_sn, FMT,
                               GROUP, X.dtype.element_ty, BLOCK_N, BLOCK_K)
            acc = _mma(acc, xt, wt, UPCAST, IEEE)
        if FMT == 3:  # y = (xq . wq) * x_scale[row] * w_scale[e, n]
            xs = tl.load(XS + in_rows, mask=mask_m, other=0.0)
            acc = acc * xs[:, None] * tl.load(WS + s_base + n * stride_sn, mask=mask_n, other=0.0)[None, :]
        if HAS_SCALE:
            s = tl.load(SCALE + p, mask=mask_mr, other=0.0).to(tl.float32)
            acc = acc * s[:, None]
        tl.store(Y + out_rows[:, None] * stride_ym + n[None, :], acc.to(Y.dtype.element_ty),
                 mask=mask_m[:, None] & mask_n[None, :])


# `@triton.jit` functions the kernels call, by the global name the kernels use.
HELPERS = {"_dequant_tile": _dequant_tile_fn, "_mma": _mma_fn, "_row_block": _row_block_fn}
_dequant_tile = None  # bound by LazyJit before each launch
_mma = None
_row_block = None
