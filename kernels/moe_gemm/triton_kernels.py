"""The Triton kernels of the MoE experts, as plain functions: `launch.py` jit-compiles them on
first launch (`kernels.runtime.LazyJit`) and, on CUDA, wraps them in the autotuner (`configs.py`).

`_row_block` and `_mma` (`@triton.jit` helpers, also called by `kernels/quant_gemm`) find a row
block's rows and do one tile's dot. `_grouped_gemm_kernel` computes one `BLOCK_M x BLOCK_N` tile of `rows @ B_e` for the one expert
its row block belongs to (from the routing's block map), gathering input rows by index and
writing grouped or scattered rows; its EPILOGUE selects what happens to the tile: 0 = plain
(optional per-row scale), 1 = SwiGLU forward (two accumulators: gate and up rows), 2 = SwiGLU
backward of the down projection (loads gu, writes dgu, h and the router-weight partials).
`_weight_grad_kernel` is the per-expert weight-gradient GEMM: one program per (expert, tile of
dW[e]) loops over its expert's rows.
"""

from __future__ import annotations

from kernels.runtime import tl


def _mma_fn(acc, xt, wt, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """acc + xt @ wt with the `dot_flags` of the launch (also the quantized GEMMs' dot)."""
    if UPCAST:  # the interpreter's tl.dot is wrong for 16-bit tiles
        xt = xt.to(tl.float32)
        wt = wt.to(tl.float32)
    if IEEE:
        return acc + tl.dot(xt, wt, input_precision="ieee")
    return tl.dot(xt, wt, acc)


def _row_block_fn(grp, pid_m, BLOCK_START, GROUP_OFFS, IN_IDX, OUT_IDX, n_experts, X_GROUPED: tl.constexpr,
                  Y_GROUPED: tl.constexpr, BLOCK_M: tl.constexpr):
    """The rows of row block `pid_m` of the routing (group `grp` >= 0, never straddling two groups):
    `(real, p, mask_m, mask_mr, in_rows, out_rows)`: whether the group is a real expert (False: the
    dropped group, whose rows only get zeros), the block's assignment rows `p` and their mask, the
    mask that is also False in the dropped group, and the int64 rows to read (`p`, or gathered by
    IN_IDX) and to write (`p`, or scattered by OUT_IDX). Shared by every grouped-GEMM kernel."""
    real = grp < n_experts
    start = tl.load(BLOCK_START + pid_m)
    end = tl.load(GROUP_OFFS + grp + 1)
    p = start + tl.arange(0, BLOCK_M)
    mask_m = p < end
    mask_mr = p < tl.where(real, end, 0)
    if X_GROUPED:
        in_rows = p.to(tl.int64)
    else:
        in_rows = tl.load(IN_IDX + p, mask=mask_m, other=0).to(tl.int64)
    if Y_GROUPED:
        out_rows = p.to(tl.int64)
    else:
        out_rows = tl.load(OUT_IDX + p, mask=mask_m, other=0).to(tl.int64)
    return real, p, mask_m, mask_mr, in_rows, out_rows


def _grouped_gemm_kernel(X, W, Y, GU, DGU, DWP, IN_IDX, OUT_IDX, SCALE, BLOCK_GROUP, BLOCK_START, GROUP_OFFS,
                         N_OUT, K_IN, n_experts,
                         stride_xm, stride_xk, stride_we, stride_wk, stride_wn, stride_ym, stride_yn,
                         stride_gm, stride_gn, stride_dgm, stride_dgn, stride_dwm, stride_dwn,
                         X_GROUPED: tl.constexpr, Y_GROUPED: tl.constexpr, HAS_SCALE: tl.constexpr,
                         EPILOGUE: tl.constexpr, STORE_GU: tl.constexpr, UPCAST: tl.constexpr,
                         IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    grp = tl.load(BLOCK_GROUP + pid_m)
    if grp >= 0:
        real, p, mask_m, mask_mr, in_rows, out_rows = _row_block(
            grp, pid_m, BLOCK_START, GROUP_OFFS, IN_IDX, OUT_IDX, n_experts, X_GROUPED, Y_GROUPED, BLOCK_M)
        p64 = p.to(tl.int64)
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = n < N_OUT
        k = tl.arange(0, BLOCK_K)
        x_ptrs = X + in_rows[:, None] * stride_xm + k[None, :] * stride_xk
        w_ptrs = W + grp.to(tl.int64) * stride_we + k[:, None] * stride_wk + n[None, :] * stride_wn
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        k_hi = tl.where(real, K_IN, 0)
        for k0 in range(0, k_hi, BLOCK_K):
            mask_k = (k0 + k) < K_IN
            xt = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            wt = tl.load(w_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            acc = _mma(acc, xt, wt, UPCAST, IEEE)
            if EPILOGUE == 1:  # the up rows sit N_OUT rows below the gate rows
                wu = tl.load(w_ptrs + N_OUT * stride_wn, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
                acc_up = _mma(acc_up, xt, wu, UPCAST, IEEE)
            x_ptrs += BLOCK_K * stride_xk
            w_ptrs += BLOCK_K * stride_wk

        mask = mask_m[:, None] & mask_n[None, :]
        y_ptrs = Y + out_rows[:, None] * stride_ym + n[None, :] * stride_yn
        if EPILOGUE == 0:
            if HAS_SCALE:
                s = tl.load(SCALE + p, mask=mask_mr, other=0.0).to(tl.float32)
                acc = acc * s[:, None]
            tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=mask)
        elif EPILOGUE == 1:
            # Round the pre-activations to the storage dtype first, so the forward's h equals the
            # h the backward recomputes from the stored gu (and the unfused reference).
            gate = acc.to(Y.dtype.element_ty).to(tl.float32)
            up = acc_up.to(Y.dtype.element_ty).to(tl.float32)
            if STORE_GU:
                gu_ptrs = GU + p64[:, None] * stride_gm + n[None, :] * stride_gn
                tl.store(gu_ptrs, gate.to(GU.dtype.element_ty), mask=mask)
                tl.store(gu_ptrs + N_OUT * stride_gn, up.to(GU.dtype.element_ty), mask=mask)
            h = gate * tl.sigmoid(gate) * up
            tl.store(y_ptrs, h.to(Y.dtype.element_ty), mask=mask)
        else:
            # acc = g = dy[token] @ down[e]; Y = h out (grouped), GU = saved pre-activations.
            lmask = mask_mr[:, None] & mask_n[None, :]
            gu_ptrs = GU + p64[:, None] * stride_gm + n[None, :] * stride_gn
            gate = tl.load(gu_ptrs, mask=lmask, other=0.0).to(tl.float32)
            up = tl.load(gu_ptrs + N_OUT * stride_gn, mask=lmask, other=0.0).to(tl.float32)
            sig = tl.sigmoid(gate)
            silu = gate * sig
            h = (silu * up).to(Y.dtype.element_ty)
            tl.store(y_ptrs, h, mask=mask)
            dwp = tl.sum(tl.where(mask, acc * h.to(tl.float32), 0.0), axis=1)
            tl.store(DWP + p64 * stride_dwm + pid_n * stride_dwn, dwp, mask=mask_m)
            s = tl.load(SCALE + p, mask=mask_mr, other=0.0).to(tl.float32)
            dh = acc * s[:, None]
            dgate = dh * up * sig * (1.0 + gate * (1.0 - sig))
            dup = dh * silu
            dg_ptrs = DGU + p64[:, None] * stride_dgm + n[None, :] * stride_dgn
            tl.store(dg_ptrs, dgate.to(DGU.dtype.element_ty), mask=mask)
            tl.store(dg_ptrs + N_OUT * stride_dgn, dup.to(DGU.dtype.element_ty), mask=mask)


def _weight_grad_kernel(A, B, DW, A_IDX, B_IDX, SCALE, GROUP_OFFS, M_A, N_B,
                        stride_am, stride_ak, stride_bm, stride_bk, stride_de, stride_di, stride_dj,
                        A_GROUPED: tl.constexpr, B_GROUPED: tl.constexpr, HAS_SCALE: tl.constexpr,
                        UPCAST: tl.constexpr, IEEE: tl.constexpr,
                        BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr):
    e = tl.program_id(0)
    pid_i = tl.program_id(1)
    pid_j = tl.program_id(2)
    start = tl.load(GROUP_OFFS + e)
    end = tl.load(GROUP_OFFS + e + 1)
    i = pid_i * BLOCK_I + tl.arange(0, BLOCK_I)
    j = pid_j * BLOCK_J + tl.arange(0, BLOCK_J)
    mask_i = i < M_A
    mask_j = j < N_B
    r = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_I, BLOCK_J], dtype=tl.float32)
    for p0 in range(start, end, BLOCK_K):
        p = p0 + r
        mask_p = p < end
        if A_GROUPED:
            a_rows = p.to(tl.int64)
        else:
            a_rows = tl.load(A_IDX + p, mask=mask_p, other=0).to(tl.int64)
        if B_GROUPED:
            b_rows = p.to(tl.int64)
        else:
            b_rows = tl.load(B_IDX + p, mask=mask_p, other=0).to(tl.int64)
        a = tl.load(A + a_rows[:, None] * stride_am + i[None, :] * stride_ak,
                    mask=mask_p[:, None] & mask_i[None, :], other=0.0)  # [BLOCK_K, BLOCK_I]
        b = tl.load(B + b_rows[:, None] * stride_bm + j[None, :] * stride_bk,
                    mask=mask_p[:, None] & mask_j[None, :], other=0.0)  # [BLOCK_K, BLOCK_J]
        if HAS_SCALE:
            s = tl.load(SCALE + p, mask=mask_p, other=0.0).to(tl.float32)
            a = (a.to(tl.float32) * s[:, None]).to(A.dtype.element_ty)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if IEEE:
            acc += tl.dot(tl.trans(a), b, input_precision="ieee")
        else:
            acc = tl.dot(tl.trans(a), b, acc)
    tl.store(DW + e.to(tl.int64) * stride_de + i[:, None] * stride_di + j[None, :] * stride_dj,
             acc.to(DW.dtype.element_ty), mask=mask_i[:, None] & mask_j[None, :])


# `@triton.jit` functions the kernels call, by the global name the kernels use (bound by LazyJit
# before each launch; the quantized GEMMs of kernels/quant_gemm share both).
HELPERS = {"_mma": _mma_fn, "_row_block": _row_block_fn}
_mma = _row_block = None
