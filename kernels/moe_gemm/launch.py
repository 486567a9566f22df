"""The MoE kernel launchers: input checks, output buffers, grids and (on CUDA) autotuning around
the kernels of `triton_kernels.py`. Each has a PyTorch `*_reference` in `reference.py` that
defines its semantics; the module docstring of the package describes the four operations."""

from __future__ import annotations

from typing import Optional

import torch

from kernels import runtime
from kernels.moe_gemm.checks import check_act, check_scale, check_tiles, check_weight
from kernels.moe_gemm.configs import (GEMM_ROWS, GEMM_TILES, INTERPRET_GEMM, INTERPRET_WGRAD, MIN_SWIGLU_BLOCK_N,
                                      SWIGLU_BWD_ROWS, SWIGLU_ROWS, WGRAD_ROWS, WGRAD_TILES)
from kernels.moe_gemm.routing import MoERouting
from kernels.moe_gemm.triton_kernels import HELPERS, _grouped_gemm_kernel, _weight_grad_kernel
from kernels.runtime import TunedKernel as _TunedKernel
from kernels.runtime import check_launch, dot_flags, interpreting, triton

KERNELS = "the Triton MoE kernels"  # how the messages of runnable_reason name them
HINT = " or use experts.name=sorted"


def runnable_reason(device: Optional[torch.device] = None) -> Optional[str]:
    """None when the Triton MoE kernels can run on `device` (default: anywhere available), else why not."""
    return runtime.runnable_reason(device, KERNELS, HINT)


_gemm = _TunedKernel(_grouped_gemm_kernel, GEMM_ROWS, GEMM_TILES, ["N_OUT", "K_IN"], helpers=HELPERS)
_swiglu_fwd = _TunedKernel(_grouped_gemm_kernel, SWIGLU_ROWS, GEMM_TILES, ["N_OUT", "K_IN"], helpers=HELPERS)
_swiglu_bwd = _TunedKernel(_grouped_gemm_kernel, SWIGLU_BWD_ROWS, GEMM_TILES, ["N_OUT", "K_IN"],
                           reset_to_zero=["DWP"], helpers=HELPERS)
_wgrad = _TunedKernel(_weight_grad_kernel, WGRAD_ROWS, WGRAD_TILES, ["M_A", "N_B"])


def _dot_flags(dtype: torch.dtype) -> dict:
    # fp32 products are exact IEEE unless torch allows TF32 matmuls (the switch F.linear obeys)
    return dot_flags(dtype, allow_tf32=torch.backends.cuda.matmul.allow_tf32)


def _gemm_args(x, w, y, gu, dgu, dwp, routing, scale, n_out, k_in, w_strides):
    dummy = routing.sorted_assign
    return (x, w, y, dummy if gu is None else gu, dummy if dgu is None else dgu, dummy if dwp is None else dwp,
            routing.sorted_token, routing.sorted_assign, dummy if scale is None else scale,
            routing.block_group, routing.block_start, routing.group_offs,
            n_out, k_in, routing.n_experts,
            x.stride(0), x.stride(1), w.stride(0), w_strides[0], w_strides[1], y.stride(0), y.stride(1),
            gu.stride(0) if gu is not None else 0, gu.stride(1) if gu is not None else 0,
            dgu.stride(0) if dgu is not None else 0, dgu.stride(1) if dgu is not None else 0,
            dwp.stride(0) if dwp is not None else 0, dwp.stride(1) if dwp is not None else 0)


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, routing: MoERouting, *, x_grouped: bool, y_grouped: bool,
                 trans_w: bool = True, scale: Optional[torch.Tensor] = None,
                 tiles: Optional[dict] = None) -> torch.Tensor:
    """`y[out(p)] = scale[p] * x[in(p)] @ (w[e]^T if trans_w else w[e])` -> `[N, out]` in x's dtype.

    x: `[N, in]` grouped (`x_grouped`) or `[T, in]` token rows (gathered by `sorted_token`);
    w: `[E, out, in]` (`trans_w`, nn.Linear layout) or `[E, in, out]`; scale: fp32 `[N]` in sorted
    order or None. The output is grouped (`y_grouped`) or in assignment order `t * K + k`; dropped
    assignments' rows are zero. `tiles={"BLOCK_N":..,"BLOCK_K":..}` fixes the tiles (else autotuned
    on CUDA, the interpreter config on CPU)."""
    what = "grouped_gemm"
    check_act("x", x, routing.n_assign if x_grouped else routing.n_tokens, None, routing, what)
    check_weight("w", w, routing, x.dtype, what)
    check_scale(scale, routing, what)
    check_tiles(tiles, GEMM_TILES)
    k_in, n_out = (w.shape[2], w.shape[1]) if trans_w else (w.shape[1], w.shape[2])
    if x.shape[1] != k_in:
        raise ValueError(f"{what}: x has {x.shape[1]} features but w{' (transposed)' if trans_w else ''} "
                         f"expects {k_in}")
    y = torch.empty(routing.n_assign, n_out, dtype=x.dtype, device=x.device)
    if routing.n_assign == 0 or n_out == 0:
        return y
    check_launch(KERNELS, x, hint=HINT)
    w_strides = (w.stride(2), w.stride(1)) if trans_w else (w.stride(1), w.stride(2))
    args = _gemm_args(x, w, y, None, None, None, routing, scale, n_out, k_in, w_strides)
    meta = dict(X_GROUPED=x_grouped, Y_GROUPED=y_grouped, HAS_SCALE=scale is not None, EPILOGUE=0,
                STORE_GU=False, BLOCK_M=routing.block_m, **_dot_flags(x.dtype))
    _gemm.launch(lambda m: (routing.max_blocks, triton.cdiv(n_out, m["BLOCK_N"])), args, meta, tiles,
                 INTERPRET_GEMM)
    return y


def gate_up_swiglu(x: torch.Tensor, gate_up: torch.Tensor, routing: MoERouting, *, x_grouped: bool = False,
                   store_gate_up: bool = True, tiles: Optional[dict] = None):
    """`(h [N, H], gu [N, 2H] or None)` grouped: `gu = x[in(p)] @ gate_up[e]^T` (gate rows, then up
    rows of `gate_up [E, 2H, D]`), `h = silu(gate) * up`; one fused kernel, x's dtype."""
    what = "gate_up_swiglu"
    check_act("x", x, routing.n_assign if x_grouped else routing.n_tokens, None, routing, what)
    check_weight("gate_up", gate_up, routing, x.dtype, what)
    check_tiles(tiles, GEMM_TILES)
    if gate_up.shape[1] % 2 or gate_up.shape[2] != x.shape[1]:
        raise ValueError(f"{what}: gate_up must be [E, 2H, D={x.shape[1]}]; got {tuple(gate_up.shape)}")
    H, D = gate_up.shape[1] // 2, gate_up.shape[2]
    h = torch.empty(routing.n_assign, H, dtype=x.dtype, device=x.device)
    gu = torch.empty(routing.n_assign, 2 * H, dtype=x.dtype, device=x.device) if store_gate_up else None
    if routing.n_assign == 0 or H == 0:
        return h, gu
    check_launch(KERNELS, x, hint=HINT)
    args = _gemm_args(x, gate_up, h, gu, None, None, routing, None, H, D, (gate_up.stride(2), gate_up.stride(1)))
    meta = dict(X_GROUPED=x_grouped, Y_GROUPED=True, HAS_SCALE=False, EPILOGUE=1, STORE_GU=store_gate_up,
                BLOCK_M=routing.block_m, **_dot_flags(x.dtype))
    _swiglu_fwd.launch(lambda m: (routing.max_blocks, triton.cdiv(H, m["BLOCK_N"])), args, meta, tiles,
                       INTERPRET_GEMM)
    return h, gu


def swiglu_down_backward(dy: torch.Tensor, down: torch.Tensor, gu: torch.Tensor, w_sorted: torch.Tensor,
                         routing: MoERouting, *, tiles: Optional[dict] = None):
    """`(dgu [N, 2H], h [N, H], dw_sorted [N] fp32)` for `y[t] = sum_k w * (h @ down[e]^T)`:
    `g = dy[token(p)] @ down[e]` (input-gradient GEMM, dy gathered by token), then in the epilogue
    `h = silu(gate) * up` from `gu`, `dw = g . h` (per column tile, summed here), `dh = w * g` and
    the SwiGLU backward. `dy [T, D]`, `down [E, D, H]`, `gu [N, 2H]` grouped, `w_sorted` fp32 [N]."""
    what = "swiglu_down_backward"
    check_act("dy", dy, routing.n_tokens, None, routing, what)
    check_weight("down", down, routing, dy.dtype, what)
    check_scale(w_sorted, routing, what)
    check_tiles(tiles, GEMM_TILES)
    D, H = down.shape[1], down.shape[2]
    if dy.shape[1] != D:
        raise ValueError(f"{what}: dy has {dy.shape[1]} features but down is [E, D={D}, H={H}]")
    check_act("gu", gu, routing.n_assign, 2 * H, routing, what)
    if gu.dtype != dy.dtype:
        raise ValueError(f"{what}: gu dtype {gu.dtype} != dy dtype {dy.dtype}")
    N = routing.n_assign
    dgu = torch.empty(N, 2 * H, dtype=dy.dtype, device=dy.device)
    h = torch.empty(N, H, dtype=dy.dtype, device=dy.device)
    min_bn = tiles["BLOCK_N"] if tiles is not None else (
        INTERPRET_GEMM["BLOCK_N"] if interpreting() else MIN_SWIGLU_BLOCK_N)
    # one partial dot product per column tile; zeroed so the columns an autotuned config with wider
    # tiles leaves unwritten add nothing (the autotuner re-zeroes it between its trial runs)
    dwp = torch.zeros(N, max(1, triton.cdiv(H, min_bn) if triton else 1), dtype=torch.float32, device=dy.device)
    if N == 0 or H == 0:
        return dgu, h, dwp.sum(1)
    check_launch(KERNELS, dy, hint=HINT)
    args = _gemm_args(dy, down, h, gu, dgu, dwp, routing, w_sorted, H, D, (down.stride(1), down.stride(2)))
    meta = dict(X_GROUPED=False, Y_GROUPED=True, HAS_SCALE=True, EPILOGUE=2, STORE_GU=False,
                BLOCK_M=routing.block_m, **_dot_flags(dy.dtype))
    _swiglu_bwd.launch(lambda m: (routing.max_blocks, triton.cdiv(H, m["BLOCK_N"])), args, meta, tiles,
                       INTERPRET_GEMM)
    return dgu, h, dwp.sum(1)


def group_weight_grad(a: torch.Tensor, b: torch.Tensor, routing: MoERouting, *, a_grouped: bool, b_grouped: bool,
                      scale: Optional[torch.Tensor] = None, tiles: Optional[dict] = None) -> torch.Tensor:
    """`dW [E, a_cols, b_cols]`, `dW[e] = sum_{p in e} (scale[p] * a[row_a(p)])^T b[row_b(p)]` (rows
    grouped, or token rows gathered by `sorted_token`); experts without rows get zeros; a's dtype."""
    what = "group_weight_grad"
    check_act("a", a, routing.n_assign if a_grouped else routing.n_tokens, None, routing, what)
    check_act("b", b, routing.n_assign if b_grouped else routing.n_tokens, None, routing, what)
    if b.dtype != a.dtype:
        raise ValueError(f"{what}: a dtype {a.dtype} != b dtype {b.dtype}")
    check_scale(scale, routing, what)
    check_tiles(tiles, WGRAD_TILES)
    E, M, Nb = routing.n_experts, a.shape[1], b.shape[1]
    dw = torch.empty(E, M, Nb, dtype=a.dtype, device=a.device)
    if M == 0 or Nb == 0:
        return dw
    check_launch(KERNELS, a, hint=HINT)
    dummy = routing.sorted_assign
    args = (a, b, dw, routing.sorted_token, routing.sorted_token, dummy if scale is None else scale,
            routing.group_offs, M, Nb, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            dw.stride(0), dw.stride(1), dw.stride(2))
    meta = dict(A_GROUPED=a_grouped, B_GROUPED=b_grouped, HAS_SCALE=scale is not None, **_dot_flags(a.dtype))
    _wgrad.launch(lambda m: (E, triton.cdiv(M, m["BLOCK_I"]), triton.cdiv(Nb, m["BLOCK_J"])), args, meta,
                  tiles, INTERPRET_WGRAD)
    return dw
