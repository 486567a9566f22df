"""Expert-choice routing: each expert picks its top-C tokens of the batch.

Zhou et al., "Mixture-of-Experts with Expert Choice Routing", NeurIPS 2022
(arXiv:2202.09368).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import torch

from moe.routing.routers.base import ROUTERS, Router, RouterConfig, RouterOutput, expert_capacity, top_k_choice


def expert_choice_capacity(n_tokens: int, top_k: int, n_experts: int, capacity_factor) -> int:
    """C = ceil(capacity_factor * T * k / E) tokens per expert (capacity_factor None = 1.0), at most T."""
    cf = 1.0 if capacity_factor is None else capacity_factor
    return min(n_tokens, expert_capacity(n_tokens * top_k, n_experts, cf))


@ROUTERS.register("expert_choice")
class ExpertChoiceRouter(Router):
    """Stages (training): gate logits (jitter, temperature) -> token-to-expert scores
    S = softmax over experts -> each expert takes the C tokens with the highest score in its
    column, C = ceil(capacity_factor * T * k / E) -> combine weight of (token, expert) =
    S[token, expert] (optionally renormalised over the experts that chose the token) -> z-loss.

    Encoding: `experts_TK` has K = E slots, slot e holds e when expert e chose the token and
    the sentinel E otherwise, so a token may get 0..E experts and the existing dispatch
    functions (`loop`, `sorted`) run unchanged. Every expert gets exactly C tokens: perfect
    balance by construction, so there is no balance loss (`aux_loss` is 0; only the z-loss
    applies). `n_dropped` counts the tokens that no expert chose (they keep only their
    residual), so the logged `dropped_frac` is that count over the E*C assignments.

    Causality caveat: an expert's choice compares all T tokens of the batch, so in causal
    LM training whether a token is processed depends on other sequences and on FUTURE
    tokens of its own sequence: information leaks across positions and the training-time
    routing cannot be reproduced token by token at generation time. Evaluation/inference
    (`router.eval()`) therefore falls back to per-token top-k on the same softmax scores
    (dropless, renormalised per `renormalize`), which is causal; the gap between the two is
    what `moe/train_eval_overlap` measures. Capacity here is the expert-choice capacity, not
    token dropping, so `finish` never applies its capacity step.
    """

    @dataclass
    class Config(RouterConfig):
        name: ClassVar[str] = "expert_choice"
        renormalize: bool = False  # the paper uses the raw softmax score as the combine weight
        aux_loss_coef: float = 0.0  # balanced by construction: no balance loss (it is reported as 0)
        capacity_factor: Optional[float] = 1.0  # C = ceil(capacity_factor * T * top_k / E) (None = 1.0)

    def forward(self, x_TD: torch.Tensor, token_ids_T=None, *, need_losses: bool = True) -> RouterOutput:
        logits_TE = self.logits(x_TD)
        probs_TE = torch.softmax(logits_TE, dim=-1)
        if not self.training:
            return self._token_choice(probs_TE, logits_TE, need_losses)
        T, E = probs_TE.shape
        C = expert_choice_capacity(T, self.top_k, E, self.cfg.capacity_factor)
        _, tokens_EC = torch.topk(probs_TE.detach().t(), C, dim=-1)
        chosen_TE = torch.zeros(T, E, dtype=torch.bool, device=probs_TE.device)
        chosen_TE[tokens_EC, torch.arange(E, device=probs_TE.device).unsqueeze(1)] = True
        ids_TE = torch.arange(E, device=probs_TE.device).expand(T, E)
        experts_TE = torch.where(chosen_TE, ids_TE, torch.full_like(ids_TE, E))
        weights_TE = torch.where(chosen_TE, probs_TE, torch.zeros_like(probs_TE))
        if self.cfg.renormalize:
            weights_TE = weights_TE / weights_TE.sum(dim=-1, keepdim=True).clamp_min(1e-20)
        unrouted = (~chosen_TE.any(dim=-1)).sum()
        return self.finish(experts_TE, weights_TE, probs_TE, logits_TE, aux_loss=probs_TE.new_zeros(()),
                           apply_capacity=False, n_dropped=unrouted, need_losses=need_losses)

    def _token_choice(self, probs_TE: torch.Tensor, logits_TE: torch.Tensor, need_losses: bool) -> RouterOutput:
        """Causal inference routing: per-token top-k on the same scores, no capacity."""
        experts_TK, weights_TK = top_k_choice(self.without_dropped(probs_TE), probs_TE, self.top_k, self.cfg.renormalize)
        return self.finish(experts_TK, weights_TK, probs_TE, logits_TE,
                           aux_loss=probs_TE.new_zeros(()) if need_losses else None, apply_capacity=False,
                           need_losses=need_losses)
