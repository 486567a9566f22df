"""Sinkhorn routing: balanced assignment in training, plain top-k at inference.

Lewis et al., "BASE Layers: Simplifying Training of Large, Sparse Models", ICML 2021
(arXiv:2103.16716) (balanced assignment); Clark et al., "Unified Scaling Laws for Routed
Language Models", ICML 2022 (arXiv:2202.01169) (Sinkhorn approximation, "S-BASE"); as in
Megatron-LM's `sinkhorn` router (`megatron/core/transformer/moe/router.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from moe.errors import ConfigError
from moe.routing.routers.base import (ROUTERS, GroupLimitedConfig, Router, RouterOutput, group_limited_mask,
                                     top_k_choice)


@torch.no_grad()
def sinkhorn_plan(logits_TE: torch.Tensor, n_iters: int) -> torch.Tensor:
    """Log of the transport plan from `n_iters` Sinkhorn iterations on exp(logits).

    Each iteration scales the rows (tokens) to sum to 1, then the columns (experts) to
    sum to T/E, so the plan ends with exactly balanced expert marginals. Log domain, so
    large logits cannot overflow exp(). No gradient (selection only).
    """
    T, E = logits_TE.shape
    log_p = logits_TE.float()
    col_target = math.log(T / E)
    for _ in range(n_iters):
        log_p = log_p - torch.logsumexp(log_p, dim=1, keepdim=True)
        log_p = log_p - torch.logsumexp(log_p, dim=0, keepdim=True) + col_target
    return log_p


@ROUTERS.register("sinkhorn")
class SinkhornRouter(Router):
    """Stages (training): gate logits (jitter, temperature) -> `sinkhorn_iters` Sinkhorn
    iterations on exp(logits) (balanced plan, no gradient) -> (group limit on the plan) ->
    top-k per token on the plan -> combine weights from the ORIGINAL softmax probabilities
    of the chosen experts (renormalised per `renormalize`) -> losses and optional capacity
    (training only; eval/inference is dropless).
    Inference (`router.eval()`): plain softmax top-k (the plan needs the whole batch and
    would leak across positions; BASE layers and Megatron also route greedily at test time).
    The balance loss is still computed for metrics (`aux_loss_coef` 0 by default).
    """

    @dataclass
    class Config(GroupLimitedConfig):
        name: ClassVar[str] = "sinkhorn"
        aux_loss_coef: float = 0.0  # balancing comes from the plan (the loss is still logged)
        # row/column normalisations of exp(logits) per forward (Megatron converges to a tolerance)
        sinkhorn_iters: int = 8

        def check(self, n_experts: int) -> None:
            super().check(n_experts)
            if not self.sinkhorn_iters >= 1:
                raise ConfigError(f"router.sinkhorn_iters={self.sinkhorn_iters} must be >= 1")

    def forward(self, x_TD: torch.Tensor, token_ids_T=None, *, need_losses: bool = True) -> RouterOutput:
        logits_TE = self.logits(x_TD)
        probs_TE = torch.softmax(logits_TE, dim=-1)
        plan_TE = sinkhorn_plan(logits_TE.detach(), self.cfg.sinkhorn_iters) if self.training else probs_TE.detach()
        select_TE = self.without_dropped(group_limited_mask(plan_TE, self.cfg.n_groups, self.cfg.topk_groups,
                                                                    self.cfg.group_score_top))
        experts_TK, weights_TK = top_k_choice(select_TE, probs_TE, self.top_k, self.cfg.renormalize)
        return self.finish(experts_TK, weights_TK, probs_TE, logits_TE, apply_capacity=self.training,
                           need_losses=need_losses)
