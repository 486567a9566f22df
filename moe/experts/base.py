"""Expert weights and the dispatch registry.

A dispatch function has the signature
`fn(x_TD, experts_TK, weights_TK, gate_up_E2HD, down_EDH) -> y_TD` and must equal the
`loop` reference (forward and gradients). Expert id `n_experts` marks a dropped assignment.
"""

from __future__ import annotations

import torch
from torch import nn

from moe.registry import Registry

EXPERT_DISPATCH: Registry = Registry("experts.name", package="moe.experts")


class SwiGLUExperts(nn.Module):
    """E SwiGLU experts stored as 3-D tensors in HF transformers' Mixtral layout:
    `gate_up_proj [E, 2H, D]` (gate rows first, then up) and `down_proj [E, D, H]`."""

    def __init__(self, n_experts: int, d_model: int, hidden: int, dispatch: str = "sorted"):
        super().__init__()
        self.n_experts, self.d_model, self.hidden = n_experts, d_model, hidden
        self.gate_up_proj = nn.Parameter(torch.empty(n_experts, 2 * hidden, d_model))
        self.down_proj = nn.Parameter(torch.empty(n_experts, d_model, hidden))
        self.dispatch_name = dispatch
        self.dispatch = EXPERT_DISPATCH.get(dispatch)

    def forward(self, x_TD: torch.Tensor, experts_TK: torch.Tensor, weights_TK: torch.Tensor) -> torch.Tensor:
        return self.dispatch(x_TD, experts_TK, weights_TK, self.gate_up_proj, self.down_proj)

    def extra_repr(self) -> str:
        return f"n_experts={self.n_experts}, d_model={self.d_model}, hidden={self.hidden}, dispatch={self.dispatch_name}"
