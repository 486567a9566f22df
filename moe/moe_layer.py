"""The MoE feed-forward layer: router + routed experts + optional shared experts."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from moe.config import ModelConfig
from moe.experts import BiasedExperts, SwiGLUExperts
from moe.profiling import stage
from moe.routing.metrics import MoERecord, make_record
from moe.routing.routers import build_router, resolve_router


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
    its losses -> dispatch runs the routed experts -> add the shared-expert FFN (scaled per
    token by sigmoid(x @ shared_gate) when `shared_expert_gate`, as Qwen2-MoE does) -> a
    metrics record.

    Returns `(y_BTD, aux_loss, record)`; `aux_loss` is the coefficient-weighted router loss
    (always computed when a coefficient is non-zero), `record` a detached `MoERecord`. With
    `need_records=False` (inference that reads neither: the engine without routing statistics)
    the router skips its losses and no record is made: `(y_BTD, None, None)`, y unchanged.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_experts, self.routed_scaling_factor = cfg.n_experts, cfg.routed_scaling_factor
        self.router = build_router(resolve_router(cfg.router), cfg.d_model, cfg.n_experts)
        if cfg.router_bias:  # a bias on the gate logits (GPT-OSS); Router.logits adds it
            self.router.bias = nn.Parameter(torch.empty(cfg.n_experts))
        if cfg.expert_bias or cfg.expert_activation != "swiglu":
            self.experts = BiasedExperts(cfg.n_experts, cfg.d_model, cfg.expert_hidden, cfg.experts.name,
                                         activation=cfg.expert_activation, alpha=cfg.swiglu_alpha,
                                         limit=cfg.swiglu_limit, bias=cfg.expert_bias)
        else:
            self.experts = SwiGLUExperts(cfg.n_experts, cfg.d_model, cfg.expert_hidden, cfg.experts.name)
        shared_hidden = cfg.resolved_shared_hidden
        self.shared = SwiGLU(cfg.d_model, shared_hidden) if shared_hidden else None
        self.shared_gate = nn.Linear(cfg.d_model, 1, bias=False) if cfg.shared_expert_gate else None

    def forward(self, x_BTD: torch.Tensor, token_ids_BT: Optional[torch.Tensor] = None, need_records: bool = True):
        B, T, D = x_BTD.shape
        x_TD = x_BTD.reshape(-1, D)
        ids_T = token_ids_BT.reshape(-1) if token_ids_BT is not None else None
        # Routers with per-sequence losses (aux_free's sequence-wise balance) need T back. The default
        # path passes exactly the arguments it always did (routing probes replay them in training mode).
        kwargs = {"seq_len": T} if self.router.uses_seq_len else {}
        if not need_records:
            kwargs["need_losses"] = False
        with stage("routing"):
            route = self.router(x_TD, ids_T, **kwargs)
        weights_TK = route.weights_TK
        if self.routed_scaling_factor != 1.0:  # DeepSeek-V2/V3 scale the routed experts' weights
            weights_TK = weights_TK * self.routed_scaling_factor
        y_TD = self.experts(x_TD, route.experts_TK, weights_TK)
        if self.shared is not None:
            shared_TD = self.shared(x_TD)
            if self.shared_gate is not None:
                shared_TD = torch.sigmoid(self.shared_gate(x_TD)) * shared_TD
            y_TD = y_TD + shared_TD
        if not need_records:
            return y_TD.view(B, T, D), None, None
        record: MoERecord = make_record(route, self.n_experts)
        return y_TD.view(B, T, D), route.loss, record
