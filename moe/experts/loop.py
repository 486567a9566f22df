"""Reference dispatch: a plain loop over experts, the "dumb" per-expert implementation that
every fast path is tested against."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from moe.experts.base import EXPERT_DISPATCH
from moe.profiling import stage


@EXPERT_DISPATCH.register("loop")
def loop_dispatch(x_TD, experts_TK, weights_TK, gate_up_E2HD, down_EDH) -> torch.Tensor:
    with stage("expert_gemm"):  # the reference gathers and scatters per expert: all of it counts as expert_gemm
        return _loop(x_TD, experts_TK, weights_TK, gate_up_E2HD, down_EDH)


def _loop(x_TD, experts_TK, weights_TK, gate_up_E2HD, down_EDH) -> torch.Tensor:
    def swiglu_expert(e, x_ND):
        gate, up = F.linear(x_ND, gate_up_E2HD[e]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, down_EDH[e])

    return loop_over_experts(x_TD, experts_TK, weights_TK, gate_up_E2HD.shape[0], swiglu_expert)


def loop_over_experts(x_TD, experts_TK, weights_TK, n_experts: int,
                      expert: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """sum_k weights_TK[t, k] * expert(experts_TK[t, k], x_TD[t]): each expert runs once on the rows
    routed to it (`expert(e, x_ND) -> [N, D]`), experts that got no token are skipped. The one loop of
    the reference dispatch and of the expert modules whose MLP is not plain SwiGLU (biased, quantized)."""
    y_TD = torch.zeros_like(x_TD)
    for e in range(n_experts):
        token_idx, slot = torch.where(experts_TK == e)
        if token_idx.numel() == 0:
            continue
        out = expert(e, x_TD[token_idx])
        w = weights_TK[token_idx, slot].unsqueeze(-1).to(out.dtype)
        y_TD = y_TD.index_add(0, token_idx, (out * w).to(y_TD.dtype))
    return y_TD
