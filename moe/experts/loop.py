"""Reference dispatch: a plain loop over experts, the "dumb" per-expert implementation that
every fast path is tested against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moe.experts.base import EXPERT_DISPATCH
from moe.profiling import stage


@EXPERT_DISPATCH.register("loop")
def loop_dispatch(x_TD, experts_TK, weights_TK, gate_up_E2HD, down_EDH) -> torch.Tensor:
    with stage("expert_gemm"):  # the reference gathers and scatters per expert: all of it counts as expert_gemm
        return _loop(x_TD, experts_TK, weights_TK, gate_up_E2HD, down_EDH)


def _loop(x_TD, experts_TK, weights_TK, gate_up_E2HD, down_EDH) -> torch.Tensor:
    y_TD = torch.zeros_like(x_TD)
    for e in range(gate_up_E2HD.shape[0]):
        token_idx, slot = torch.where(experts_TK == e)
        if token_idx.numel() == 0:
            continue
        gate, up = F.linear(x_TD[token_idx], gate_up_E2HD[e]).chunk(2, dim=-1)
        out = F.linear(F.silu(gate) * up, down_EDH[e])
        w = weights_TK[token_idx, slot].unsqueeze(-1).to(out.dtype)
        y_TD = y_TD.index_add(0, token_idx, (out * w).to(y_TD.dtype))
    return y_TD
