"""The expert MLP's forward and backward as sequences of kernel launches (no autograd here: the
autograd Function that calls these is `moe/experts/triton_mlp.py`; `kernels.compile_check` calls
them directly to compile every kernel the MLP launches).

Forward: `gate_up_swiglu` (the first GEMM with SwiGLU fused), then `grouped_gemm` scattered to
assignment rows with the router weight. Backward: `swiglu_down_backward` (the down GEMM's input
gradient with the SwiGLU backward and the router-weight gradient fused), `grouped_gemm` for dx,
two `group_weight_grad` for the weights.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from kernels.moe_gemm.launch import gate_up_swiglu, group_weight_grad, grouped_gemm, swiglu_down_backward
from kernels.moe_gemm.routing import MoERouting


def sorted_weights(weights_TK: torch.Tensor, routing: MoERouting) -> torch.Tensor:
    """The router weights in the routing's sorted order, fp32 `[N]` (the kernels' `scale`)."""
    return weights_TK.reshape(-1)[routing.sorted_assign.long()].float().contiguous()


def expert_mlp_forward(x: torch.Tensor, w_sorted: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                       routing: MoERouting, *, store_gate_up: bool, tiles: Optional[dict] = None):
    """`(y [T, D], gu [N, 2H] or None)`: `y[t] = sum_k w[t, k] * SwiGLU-expert_{e[t, k]}(x[t])` in x's
    dtype, and the grouped pre-activations the backward needs (kept if `store_gate_up`)."""
    T, K = routing.n_tokens, routing.top_k
    h, gu = gate_up_swiglu(x, gate_up, routing, store_gate_up=store_gate_up, tiles=tiles)
    y_NkD = grouped_gemm(h, down, routing, x_grouped=True, y_grouped=False, scale=w_sorted, tiles=tiles)
    return y_NkD.view(T, K, y_NkD.shape[1]).sum(1), gu


def expert_mlp_backward(dy: torch.Tensor, x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                        gu: torch.Tensor, w_sorted: torch.Tensor, routing: MoERouting, *, needs: Sequence[bool],
                        tiles: Optional[dict] = None):
    """`(dx [T, D], dweights [T, K] fp32, dgate_up, ddown)` of `expert_mlp_forward` for the output
    gradient `dy` (x's dtype, contiguous); `needs` says which of the four to compute (None for the rest)."""
    T, K = routing.n_tokens, routing.top_k
    wtiles = None if tiles is None else dict(BLOCK_I=tiles["BLOCK_N"], BLOCK_J=tiles["BLOCK_N"],
                                             BLOCK_K=tiles["BLOCK_K"])
    need_dx, need_dweights, need_dgate_up, need_ddown = needs
    dgu, h, dw_sorted = swiglu_down_backward(dy, down, gu, w_sorted, routing, tiles=tiles)
    dx = dweights = dgate_up = ddown = None
    if need_dx:
        dx_NkD = grouped_gemm(dgu, gate_up, routing, x_grouped=True, y_grouped=False, trans_w=False, tiles=tiles)
        dx = dx_NkD.view(T, K, dx_NkD.shape[1]).sum(1)
    if need_dweights:
        dweights = torch.empty_like(dw_sorted).scatter_(0, routing.sorted_assign.long(), dw_sorted).view(T, K)
    if need_dgate_up:
        dgate_up = group_weight_grad(dgu, x, routing, a_grouped=True, b_grouped=False, tiles=wtiles)
    if need_ddown:
        ddown = group_weight_grad(dy, h, routing, a_grouped=False, b_grouped=True, scale=w_sorted, tiles=wtiles)
    return dx, dweights, dgate_up, ddown
