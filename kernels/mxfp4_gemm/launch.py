"""The MXFP4 GEMM launchers: input checks, output buffers, grids and (on CUDA) autotuning around the
kernels of `triton_kernels.py`. Each has a PyTorch reference in `reference.py`."""

from __future__ import annotations

from typing import Optional

import torch

from kernels import runtime
from kernels.moe_gemm.checks import check_scale, check_tiles
from kernels.moe_gemm.routing import MoERouting
from kernels.mxfp4_gemm.checks import MXWeight
from kernels.mxfp4_gemm.configs import (GATHER_FP32_ROWS, GATHER_ROWS, GATHER_TILES, INTERPRET_GATHER,
                                        INTERPRET_LINEAR, LINEAR_FP32_ROWS, LINEAR_ROWS, LINEAR_TILES)
from kernels.mxfp4_gemm.triton_kernels import HELPERS, _mx_gather_kernel, _mx_linear_kernel
from kernels.runtime import FLOAT_DTYPES, TunedKernel, check_launch, dot_flags, pow2, triton

KERNELS = "the Triton MXFP4 GEMM kernels"
HINT = " (the quantized modules fall back to dequantise-then-matmul by themselves)"

_linear = {ieee: TunedKernel(_mx_linear_kernel, LINEAR_FP32_ROWS if ieee else LINEAR_ROWS, LINEAR_TILES,
                             ["N_OUT", "K_IN", "M_BUCKET"], helpers=HELPERS) for ieee in (False, True)}
_gather = {ieee: TunedKernel(_mx_gather_kernel, GATHER_FP32_ROWS if ieee else GATHER_ROWS, GATHER_TILES,
                             ["N_OUT", "K_IN"], helpers=HELPERS) for ieee in (False, True)}


def runnable_reason(device: Optional[torch.device] = None) -> Optional[str]:
    """None when the MXFP4 GEMM kernels can run on `device`, else why not."""
    return runtime.runnable_reason(device, KERNELS, HINT)


def _check_x(x: torch.Tensor, w: MXWeight, rows: int, what: str) -> None:
    if x.dtype not in FLOAT_DTYPES or x.dim() != 2 or x.shape != (rows, w.in_features) or x.stride(-1) != 1:
        raise ValueError(f"{what}: x must be a row-contiguous [{rows}, I={w.in_features}] tensor of "
                         f"{[str(d) for d in FLOAT_DTYPES]}; got {x.dtype} {tuple(x.shape)}")
    if x.device != w.blocks.device:
        raise ValueError(f"{what}: x is on {x.device} but the weight on {w.blocks.device}")


def _check_tiles_k(tiles: Optional[dict], what: str) -> None:
    if tiles is not None and tiles.get("BLOCK_K", 32) % 32:
        raise ValueError(f"{what}: tiles BLOCK_K={tiles['BLOCK_K']} must be a multiple of 32 (one scale per 32)")


def mxfp4_linear(x: torch.Tensor, w: MXWeight, bias: Optional[torch.Tensor] = None, *,
                 tiles: Optional[dict] = None) -> torch.Tensor:
    """`x [..., I] @ deq(W [O, I])^T (+ bias [O])` -> `[..., O]` in x's dtype, the weight dequantised
    tile by tile inside the kernel, fp32 accumulation."""
    what = "mxfp4_linear"
    if w.n_experts is not None:
        raise ValueError(f"{what}: w must be a 2-D [O, I] weight; got blocks {tuple(w.blocks.shape)} "
                         "(expert stacks go through mxfp4_grouped_gemm)")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    _check_x(x2, w, x2.shape[0], what)
    check_tiles(tiles, LINEAR_TILES)
    _check_tiles_k(tiles, what)
    if bias is not None and (bias.shape != (w.out_features,) or bias.device != x.device):
        raise ValueError(f"{what}: bias must be [O={w.out_features}] on {x.device}; got {tuple(bias.shape)}")
    M, O = x2.shape[0], w.out_features
    y = torch.empty(M, O, dtype=x.dtype, device=x.device)
    if M == 0 or O == 0:
        return y.reshape(*lead, O)
    check_launch(KERNELS, x2, hint=HINT)
    args = (x2, w.blocks, w.scales, w.scales if bias is None else bias, y, M, O, w.in_features, min(pow2(M), 256),
            x2.stride(0), w.blocks.stride(-3), w.scales.stride(-2), y.stride(0))
    meta = dict(HAS_BIAS=bias is not None, **dot_flags(x.dtype, allow_tf32=torch.backends.cuda.matmul.allow_tf32))
    _linear[meta["IEEE"]].launch(lambda m: (triton.cdiv(M, m["BLOCK_M"]), triton.cdiv(O, m["BLOCK_N"])), args,
                                 meta, tiles, INTERPRET_LINEAR)
    return y.reshape(*lead, O)


def mxfp4_grouped_gemm(x: torch.Tensor, w: MXWeight, routing: MoERouting, *, x_grouped: bool = False,
                       y_grouped: bool = True, scale: Optional[torch.Tensor] = None,
                       tiles: Optional[dict] = None) -> torch.Tensor:
    """The expert gather-GEMM: `y[out(p)] = scale[p] * x[in(p)] @ deq(W[e_p])^T` -> `[N, O]` in x's dtype.
    x: `[T, I]` token rows gathered by `routing.sorted_token`, or `[N, I]` already grouped; w: an expert
    stack; output grouped (sorted order) or in assignment order `t * K + k`; dropped rows are zero."""
    what = "mxfp4_grouped_gemm"
    if w.n_experts != routing.n_experts:
        raise ValueError(f"{what}: w must be an expert stack [E={routing.n_experts}, O, G, 16]; got blocks "
                         f"{tuple(w.blocks.shape)}")
    _check_x(x, w, routing.n_assign if x_grouped else routing.n_tokens, what)
    if x.device != routing.device:
        raise ValueError(f"{what}: x is on {x.device} but the routing on {routing.device}")
    check_scale(scale, routing, what)
    check_tiles(tiles, GATHER_TILES)
    _check_tiles_k(tiles, what)
    N, O = routing.n_assign, w.out_features
    y = torch.empty(N, O, dtype=x.dtype, device=x.device)
    if N == 0 or O == 0:
        return y
    check_launch(KERNELS, x, hint=HINT)
    args = (x, w.blocks, w.scales, y, routing.sorted_token, routing.sorted_assign,
            routing.sorted_assign if scale is None else scale, routing.block_group, routing.block_start,
            routing.group_offs, O, w.in_features, routing.n_experts, x.stride(0), w.blocks.stride(0),
            w.blocks.stride(1), w.scales.stride(0), w.scales.stride(1), y.stride(0))
    meta = dict(X_GROUPED=x_grouped, Y_GROUPED=y_grouped, HAS_SCALE=scale is not None, BLOCK_M=routing.block_m,
                **dot_flags(x.dtype, allow_tf32=torch.backends.cuda.matmul.allow_tf32))
    _gather[meta["IEEE"]].launch(lambda m: (routing.max_blocks, triton.cdiv(O, m["BLOCK_N"])), args, meta,
                                 tiles, INTERPRET_GATHER)
    return y
