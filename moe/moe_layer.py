"""The MoE feed-forward layer: router + routed experts + optional shared experts."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from moe.config import ModelConfig, RouterConfig
from moe.experts import SwiGLUExperts
from moe.metrics import MoERecord, make_record
from moe.routers import build_router


class SwiGLU(nn.Module):
    """Dense SwiGLU FFN (used for dense layers and shared experts): down(silu(gate(x)) * up(x))."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    """Stages of `forward`: flatten to tokens -> router picks (experts_TK, weights_TK) and
    its losses -> dispatch runs the routed experts -> add shared experts -> a metrics record.

    Returns `(y_BTD, aux_loss, record)`; `aux_loss` is the coefficient-weighted router loss
    (always computed when a coefficient is non-zero), `record` a detached `MoERecord`.
    """

    def __init__(self, cfg: ModelConfig, router_cfg: RouterConfig, dispatch: str = "sorted"):
        super().__init__()
        self.n_experts = cfg.n_experts
        self.router = build_router(router_cfg, cfg.d_model, cfg.n_experts)
        self.experts = SwiGLUExperts(cfg.n_experts, cfg.d_model, cfg.expert_hidden, dispatch)
        self.shared = SwiGLU(cfg.d_model, cfg.n_shared_experts * cfg.expert_hidden) if cfg.n_shared_experts else None
        self.balance = None  # distributed runs: balance loss over all ranks (moe/distributed/balance.py)

    def forward(self, x_BTD: torch.Tensor, token_ids_BT: Optional[torch.Tensor] = None):
        B, T, D = x_BTD.shape
        x_TD = x_BTD.reshape(-1, D)
        ids_T = token_ids_BT.reshape(-1) if token_ids_BT is not None else None
        # Routers with per-sequence losses (aux_free's sequence-wise balance) need T back.
        route = self.router(x_TD, ids_T, seq_len=T) if self.router.uses_seq_len else self.router(x_TD, ids_T)
        if self.balance is not None and self.training:
            route = self.balance(route)
        y_TD = self.experts(x_TD, route.experts_TK, route.weights_TK)
        if self.shared is not None:
            y_TD = y_TD + self.shared(x_TD)
        record: MoERecord = make_record(route, self.n_experts)
        return y_TD.view(B, T, D), route.loss, record
