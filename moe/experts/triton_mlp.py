"""The expert MLP of the `triton` dispatch as an autograd Function over the Triton kernels of
`kernels/moe_gemm` (the kernels and their launch sequences live there; the autograd bookkeeping
here; the dispatch that applies it under autocast in `triton.py`), ScatterMoE-style.

`moe_mlp` is differentiable in x, the router weights and both expert weight tensors; the
backward runs through the same kernels (`kernels.moe_gemm.expert_mlp_backward`).
"""

from __future__ import annotations

from typing import Optional

import torch

from kernels.moe_gemm import (MoERouting, expert_mlp_backward, expert_mlp_forward, moe_routing, runnable_reason,
                              sorted_weights)


class MoEMLPFunction(torch.autograd.Function):
    """`y [T, D] = sum_k w[t, k] * SwiGLU-expert_{e[t, k]}(x[t])` from the Triton kernels, with a full
    backward through the same kernels (dx, d gate_up, d down and the router weights)."""

    @staticmethod
    def forward(ctx, x, weights_TK, gate_up, down, routing: MoERouting, tiles: Optional[dict] = None):
        w_sorted = sorted_weights(weights_TK, routing)
        need_grad = any(ctx.needs_input_grad[:4])
        y, gu = expert_mlp_forward(x, w_sorted, gate_up, down, routing, store_gate_up=need_grad, tiles=tiles)
        ctx.save_for_backward(x, gate_up, down, gu, w_sorted)
        ctx.routing, ctx.tiles, ctx.w_dtype = routing, tiles, weights_TK.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        x, gate_up, down, gu, w_sorted = ctx.saved_tensors
        dx, dweights, dgate_up, ddown = expert_mlp_backward(
            dy.to(x.dtype).contiguous(), x, gate_up, down, gu, w_sorted, ctx.routing,
            needs=ctx.needs_input_grad[:4], tiles=ctx.tiles)
        if dweights is not None:
            dweights = dweights.to(ctx.w_dtype)
        return dx, dweights, dgate_up, ddown, None, None


def moe_mlp(x_TD: torch.Tensor, experts_TK: torch.Tensor, weights_TK: torch.Tensor, gate_up_E2HD: torch.Tensor,
            down_EDH: torch.Tensor, *, block_m: Optional[int] = None, tiles: Optional[dict] = None) -> torch.Tensor:
    """The expert MLP of an MoE layer with the Triton kernels (differentiable in x, the router
    weights and both expert weight tensors). x and the weights must share a dtype (fp32/fp16/bf16);
    the router weights may be any float dtype (they are used in fp32). Returns `[T, D]` in x's dtype.
    `tiles={"BLOCK_N", "BLOCK_K"}` fixes every kernel's tiles (tests); default: autotuned on CUDA."""
    reason = runnable_reason(x_TD.device)
    if reason is not None:
        raise RuntimeError(reason)
    if x_TD.dim() != 2:
        raise ValueError(f"moe_mlp: x must be [tokens, d_model]; got shape {tuple(x_TD.shape)}")
    if experts_TK.shape[0] != x_TD.shape[0] or weights_TK.shape != experts_TK.shape:
        raise ValueError(f"moe_mlp: experts {tuple(experts_TK.shape)} and weights {tuple(weights_TK.shape)} must "
                         f"both be [tokens={x_TD.shape[0]}, top_k]")
    if not weights_TK.is_floating_point():
        raise ValueError(f"moe_mlp: router weights must be floating point; got {weights_TK.dtype}")
    for name, t in (("experts", experts_TK), ("weights", weights_TK), ("gate_up", gate_up_E2HD), ("down", down_EDH)):
        if t.device != x_TD.device:
            raise ValueError(f"moe_mlp: x is on {x_TD.device} but {name} on {t.device}")
    E = gate_up_E2HD.shape[0]
    if down_EDH.dim() != 3 or down_EDH.shape[0] != E or down_EDH.shape[1] != x_TD.shape[1] \
            or gate_up_E2HD.dim() != 3 or gate_up_E2HD.shape[1] != 2 * down_EDH.shape[2]:
        raise ValueError(f"moe_mlp: need gate_up [E, 2H, D] and down [E, D, H] with D={x_TD.shape[1]}; got "
                         f"{tuple(gate_up_E2HD.shape)} and {tuple(down_EDH.shape)}")
    routing = moe_routing(experts_TK, E, block_m)
    return MoEMLPFunction.apply(x_TD.contiguous(), weights_TK, gate_up_E2HD.contiguous(), down_EDH.contiguous(),
                                routing, tiles)
