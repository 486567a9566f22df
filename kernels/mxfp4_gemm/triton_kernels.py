"""The weight-only MXFP4 GEMM kernels, as plain functions (`launch.py` jit-compiles them on first
launch and, on CUDA, wraps them in the autotuner of `configs.py`). Same structure as
`kernels/quant_gemm` (one dense kernel, one expert gather-GEMM on `kernels.moe_gemm`'s routing); only
the weight tile differs, so it is its own small family rather than a fifth format there: its scales
are uint8 exponents per 32 inputs, not fp32 per row or group.

`_mx_tile` dequantises one `[BLOCK_K, BLOCK_N]` tile in registers: each byte is loaded once and its
low (even k) and high (odd k) nibbles are interleaved; an e2m1 code (sign, 2-bit exponent, 1-bit
mantissa) and its block's e8m0 exponent are decoded with integer arithmetic into fp32 bit patterns
(no `tl.float8` / fp4 types, so it builds for sm_80 as for sm_90); the product is exact in fp32 and
is rounded to the activations' dtype, as `Scheme.dequantize` rounds it. Then `tl.dot` with an fp32
accumulator. Offsets are int64.
"""

from __future__ import annotations

from kernels.moe_gemm.triton_kernels import _mma_fn, _row_block_fn
from kernels.runtime import tl


def _mx_tile_fn(QB, QS, b_base, s_base, n, k0, mask_n, K_IN, stride_bn, stride_sn,
                DTYPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """deq(W)[n, k0:k0 + BLOCK_K] as a `[BLOCK_K, BLOCK_N]` tile (k down, n across) in DTYPE; 0 outside."""
    kk = k0 + tl.arange(0, BLOCK_K).to(tl.int64)
    mask = (kk < K_IN)[:, None] & mask_n[None, :]
    j = k0 // 2 + tl.arange(0, BLOCK_K // 2).to(tl.int64)  # k0 is even: whole bytes
    byte = tl.load(QB + b_base + n[None, :] * stride_bn + j[:, None],
                   mask=((2 * j) < K_IN)[:, None] & mask_n[None, :], other=0).to(tl.int32)
    code = tl.reshape(tl.permute(tl.join(byte & 15, byte >> 4), (0, 2, 1)), (BLOCK_K, BLOCK_N))
    e = (code >> 1) & 3
    m = code & 1
    # e2m1: e == 0 is 0 or 0.5 (subnormal); else 2^(e-1) * (1 + m/2), as fp32 bits (exponent e - 1 + 127)
    normal = (((e + 126) << 23) | (m << 22)).to(tl.float32, bitcast=True)
    mag = tl.where(e > 0, normal, m.to(tl.float32) * 0.5)
    val = tl.where((code & 8) != 0, -mag, mag)
    sc = tl.load(QS + s_base + n[None, :] * stride_sn + (kk // 32)[:, None], mask=mask, other=127).to(tl.int32)
    # e8m0 -> 2^(s - 127) as fp32 bits; s == 0 is 2^-127, an fp32 subnormal (bit 22)
    scale = tl.where(sc > 0, sc << 23, 1 << 22).to(tl.float32, bitcast=True)
    return tl.where(mask, val * scale, 0.0).to(DTYPE)


def _mx_linear_kernel(X, QB, QS, BIAS, Y, M, N_OUT, K_IN, M_BUCKET, stride_xm, stride_bn, stride_sn, stride_ym,
                      HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
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
        xt = tl.load(X + m[:, None] * stride_xm + kk[None, :], mask=mask_m[:, None] & (kk < K_IN)[None, :], other=0.0)
        wt = _mx_tile(QB, QS, 0, 0, n, k0, mask_n, K_IN, stride_bn, stride_sn, X.dtype.element_ty, BLOCK_N, BLOCK_K)
        acc = _mma(acc, xt, wt, UPCAST, IEEE)
    if HAS_BIAS:
        acc += tl.load(BIAS + n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + m[:, None] * stride_ym + n[None, :], acc.to(Y.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


def _mx_gather_kernel(X, QB, QS, Y, IN_IDX, OUT_IDX, SCALE, BLOCK_GROUP, BLOCK_START, GROUP_OFFS,
                      N_OUT, K_IN, n_experts, stride_xm, stride_be, stride_bn, stride_se, stride_sn, stride_ym,
                      X_GROUPED: tl.constexpr, Y_GROUPED: tl.constexpr, HAS_SCALE: tl.constexpr,
                      UPCAST: tl.constexpr, IEEE: tl.constexpr,
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
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, tl.where(real, K_IN, 0), BLOCK_K):  # the dropped group: no K loop, zero rows
            kk = k0 + k
            xt = tl.load(X + in_rows[:, None] * stride_xm + kk[None, :],
                         mask=mask_m[:, None] & (kk < K_IN)[None, :], other=0.0)
            wt = _mx_tile(QB, QS, e64 * stride_be, e64 * stride_se, n, k0, mask_n, K_IN, stride_bn, stride_sn,
                          X.dtype.element_ty, BLOCK_N, BLOCK_K)
            acc = _mma(acc, xt, wt, UPCAST, IEEE)
        if HAS_SCALE:
            acc = acc * tl.load(SCALE + p, mask=mask_mr, other=0.0).to(tl.float32)[:, None]
        tl.store(Y + out_rows[:, None] * stride_ym + n[None, :], acc.to(Y.dtype.element_ty),
                 mask=mask_m[:, None] & mask_n[None, :])


# `@triton.jit` functions the kernels call, by the global name the kernels use.
HELPERS = {"_mx_tile": _mx_tile_fn, "_mma": _mma_fn, "_row_block": _row_block_fn}
_mx_tile = None  # bound by LazyJit before each launch
_mma = None
_row_block = None
