"""The quantized GEMM launchers: input checks, output buffers, grids and (on CUDA) autotuning around
the kernels of `triton_kernels.py`. Each has a PyTorch reference in `reference.py`."""

from __future__ import annotations

from typing import Optional

import torch

from kernels import runtime
from kernels.moe_gemm.checks import check_scale, check_tiles
from kernels.moe_gemm.routing import MoERouting
from kernels.quant_gemm.checks import FMT_CODES, QuantWeight, check_act
from kernels.quant_gemm.configs import (GATHER_FP32_ROWS, GATHER_ROWS, GATHER_TILES, INTERPRET_GATHER,
                                        INTERPRET_LINEAR, LINEAR_FP32_ROWS, LINEAR_ROWS, LINEAR_TILES)
from kernels.quant_gemm.triton_kernels import HELPERS, _quant_gather_kernel, _quant_linear_kernel
from kernels.runtime import TunedKernel, check_launch, dot_flags, pow2, triton

KERNELS = "the Triton quantized GEMM kernels"
HINT = " (the quantized modules fall back to dequantise-then-matmul by themselves)"

# M_BUCKET (the row count rounded up to a power of two, capped) keys the dense autotuner, so a
# decode step and a prefill get their own tiles without a re-tune for every batch size.
# keyed by the IEEE flag: exact-fp32 dots get their own narrow tiles (configs.py)
_linear = {ieee: TunedKernel(_quant_linear_kernel, LINEAR_FP32_ROWS if ieee else LINEAR_ROWS, LINEAR_TILES,
                             ["N_OUT", "K_IN", "M_BUCKET", "FMT"], helpers=HELPERS) for ieee in (False, True)}
_gather = {ieee: TunedKernel(_quant_gather_kernel, GATHER_FP32_ROWS if ieee else GATHER_ROWS, GATHER_TILES,
                             ["N_OUT", "K_IN", "FMT"], helpers=HELPERS) for ieee in (False, True)}


def runnable_reason(device: Optional[torch.device] = None) -> Optional[str]:
    """None when the quantized GEMM kernels can run on `device`, else why not."""
    return runtime.runnable_reason(device, KERNELS, HINT)


def _flags(w: QuantWeight, dtype: torch.dtype, w8a8: bool) -> dict:
    if w8a8:  # E4M3 x E4M3 -> fp32 on tensor cores; the interpreter computes fp8 dots exactly too
        return dict(FMT=3, GROUP=1, UPCAST=False, IEEE=False)
    return dict(FMT=FMT_CODES[w.fmt], GROUP=w.group_size if w.fmt == "int4" else 1,
                **dot_flags(dtype, allow_tf32=torch.backends.cuda.matmul.allow_tf32))


def quant_linear(x: torch.Tensor, w: QuantWeight, bias: Optional[torch.Tensor] = None, *,
                 x_scale: Optional[torch.Tensor] = None, out_dtype: Optional[torch.dtype] = None,
                 tiles: Optional[dict] = None) -> torch.Tensor:
    """`x [..., I] @ deq(W [O, I])^T (+ bias [O])` -> `[..., O]` in x's dtype, the weight dequantised
    tile by tile inside the kernel (fp32 accumulation). W8A8 (fp8 weight, sm_89+ or the interpreter):
    x float8_e4m3fn with `x_scale` fp32 `[...]` (one per row), `y = (x . q) * x_scale * w_scale` from
    an FP8 tensor-core dot, in `out_dtype`."""
    what = "quant_linear"
    if w.n_experts is not None:
        raise ValueError(f"{what}: w must be a 2-D [O, I] weight; got qweight {tuple(w.qweight.shape)} "
                         "(expert stacks go through quant_grouped_gemm)")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    xs = None if x_scale is None else x_scale.reshape(-1)
    out_dtype = check_act(x2, w, x2.shape[0], what, xs, out_dtype)
    check_tiles(tiles, LINEAR_TILES)
    if bias is not None and (bias.shape != (w.out_features,) or bias.device != x.device):
        raise ValueError(f"{what}: bias must be [O={w.out_features}] on {x.device}; got {tuple(bias.shape)} "
                         f"on {bias.device}")
    M, O = x2.shape[0], w.out_features
    y = torch.empty(M, O, dtype=out_dtype, device=x.device)
    if M == 0 or O == 0:
        return y.reshape(*lead, O)
    check_launch(KERNELS, x2, hint=HINT)
    args = (x2, w.scale if xs is None else xs, w.qweight, w.scale, w.scale if w.zero is None else w.zero,
            w.scale if bias is None else bias, y,
            M, O, w.in_features, min(pow2(M), 256), x2.stride(0), w.qweight.stride(-2), w.scale.stride(-2),
            y.stride(0))
    meta = dict(HAS_BIAS=bias is not None, **_flags(w, x.dtype, xs is not None))
    _linear[meta["IEEE"]].launch(lambda m: (triton.cdiv(M, m["BLOCK_M"]), triton.cdiv(O, m["BLOCK_N"])), args,
                                 meta, tiles, INTERPRET_LINEAR)
    return y.reshape(*lead, O)


def quant_grouped_gemm(x: torch.Tensor, w: QuantWeight, routing: MoERouting, *, x_grouped: bool = False,
                       y_grouped: bool = True, scale: Optional[torch.Tensor] = None,
                       x_scale: Optional[torch.Tensor] = None, out_dtype: Optional[torch.dtype] = None,
                       tiles: Optional[dict] = None) -> torch.Tensor:
    """The expert gather-GEMM: `y[out(p)] = scale[p] * x[in(p)] @ deq(W[e_p])^T` -> `[N, O]` in x's dtype.

    x: `[T, I]` token rows gathered by `routing.sorted_token`, or `[N, I]` already grouped; w: an
    expert stack `[E, O, I']`; the output is grouped (sorted order) or in assignment order
    `t * K + k` (`y_grouped=False`); dropped assignments get zero rows. scale: fp32 `[N]` sorted.
    W8A8 as in `quant_linear`: E4M3 x with `x_scale` fp32, one per row of x (token or grouped)."""
    what = "quant_grouped_gemm"
    if w.n_experts != routing.n_experts:
        raise ValueError(f"{what}: w must be an expert stack [E={routing.n_experts}, O, I']; got qweight "
                         f"{tuple(w.qweight.shape)}")
    out_dtype = check_act(x, w, routing.n_assign if x_grouped else routing.n_tokens, what, x_scale, out_dtype)
    if x.device != routing.device:
        raise ValueError(f"{what}: x is on {x.device} but the routing on {routing.device}")
    check_scale(scale, routing, what)
    check_tiles(tiles, GATHER_TILES)
    N, O = routing.n_assign, w.out_features
    y = torch.empty(N, O, dtype=out_dtype, device=x.device)
    if N == 0 or O == 0:
        return y
    check_launch(KERNELS, x, hint=HINT)
    dummy = routing.sorted_assign
    args = (x, w.scale if x_scale is None else x_scale, w.qweight, w.scale, w.scale if w.zero is None else w.zero, y,
            routing.sorted_token, routing.sorted_assign, dummy if scale is None else scale, routing.block_group,
            routing.block_start, routing.group_offs, O, w.in_features, routing.n_experts, x.stride(0),
            w.qweight.stride(0), w.qweight.stride(1), w.scale.stride(0), w.scale.stride(1), y.stride(0))
    meta = dict(X_GROUPED=x_grouped, Y_GROUPED=y_grouped, HAS_SCALE=scale is not None, BLOCK_M=routing.block_m,
                **_flags(w, x.dtype, x_scale is not None))
    _gather[meta["IEEE"]].launch(lambda m: (routing.max_blocks, triton.cdiv(O, m["BLOCK_N"])), args, meta,
                                 tiles, INTERPRET_GATHER)
    return y
